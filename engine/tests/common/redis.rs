//! A throwaway Redis server on 127.0.0.1 (Debian's redis-server package;
//! `.ci/run` installs it), append-only, in its own directory, stopped by
//! PID when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub url: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server, or None (with the reason printed) if redis-server
    /// is not installed; under `CI=true` that is a failure instead.
    pub fn start() -> Option<RedisServer> {
        let Some(bin) = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
        else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "redis-server is not installed (CI installs Debian's redis-server package)"
            );
            eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
            return None;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let port = super::procs::free_port().port();
        let child = Command::new(bin)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "yes", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let server = RedisServer {
            url: format!("redis://127.0.0.1:{port}/"),
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
