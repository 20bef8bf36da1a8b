//! Real `walrelay` processes in tests: children whose output is collected,
//! loopback ports, and the cluster key files their replication ports
//! authenticate with.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the kernel's ephemeral ports start (the source ports of outgoing
/// connections, and what binding port 0 hands out).
pub fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A loopback port nobody listens on right now, for a process to listen
/// on (released before use, so it is probed, not held).
///
/// Taken from below the ephemeral range, in 10000..20000: a port from
/// binding port 0 is an ephemeral one, and the kernel may hand it out
/// again as the source port of any outgoing connection (a primary
/// dialing its followers) before the process meant to listen on it
/// binds it ("Address already in use"). Each call in a test process
/// moves on from the last, starting at an offset of its own.
pub fn free_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return SocketAddr::from(([127, 0, 0, 1], port));
        }
    }
    panic!("no free port on 127.0.0.1 in {LOW}..{}", LOW + SPAN)
}

/// "a:1,b:2", as the `walrelay` address-list flags take it.
pub fn join_addrs(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits until `addr` accepts TCP connections.
pub fn wait_accepting(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{what} at {addr} never accepted");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Creates a fresh cluster key file (mode 0600) in `dir`; returns its path
/// and the key, for processes (`--cluster-key`) and in-process nodes alike.
pub fn cluster_key_file(dir: &Path) -> (PathBuf, walrelay_engine::ClusterKey) {
    let path = dir.join("cluster.key");
    let key = walrelay_engine::ClusterKey::create(&path).expect("cluster key");
    (path, key)
}

/// The `--cluster-key FILE` arguments.
pub fn key_args(path: &Path) -> [String; 2] {
    ["--cluster-key".into(), path.display().to_string()]
}

/// A `walrelay` child process whose output is collected (and drained, so
/// a chatty process never blocks on a full pipe): `lines` holds stdout and
/// stderr, `errors` stderr alone (also echoed to the test's). Killed on
/// drop, which unwinding runs too, and by the kernel if the test process
/// dies.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
    pub errors: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(name: &str, args: &[String]) -> Proc {
        let mut command = Command::new(env!("CARGO_BIN_EXE_walrelay"));
        command
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: runs in the child between fork and exec and calls only
        // prctl(2), which is async-signal-safe: if the test process is
        // killed, the kernel kills the child rather than leave it holding
        // ports.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().expect("spawn walrelay");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let collect = |stream: Box<dyn std::io::Read + Send>,
                       also: Option<(String, Arc<Mutex<Vec<String>>>)>| {
            let all = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some((name, errors)) = &also {
                        eprintln!("[{name}] {line}");
                        errors.lock().expect("errors").push(line.clone());
                    }
                    all.lock().expect("lines").push(line);
                }
            });
        };
        collect(Box::new(child.stdout.take().expect("stdout")), None);
        collect(
            Box::new(child.stderr.take().expect("stderr")),
            Some((name.to_string(), Arc::clone(&errors))),
        );
        Proc {
            name: name.to_string(),
            child,
            lines,
            errors,
        }
    }

    /// Waits for a line (stdout or stderr) containing `needle`; fails (with
    /// what the process printed) if it exits or takes too long.
    pub fn wait_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before printing {needle:?}: {:#?}",
                    self.name,
                    self.lines.lock().expect("lines")
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} never printed {needle:?}: {:#?}",
                self.name,
                self.lines.lock().expect("lines")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every line printed so far (stdout and stderr).
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// The stderr lines containing `needle` so far.
    pub fn error_lines(&self, needle: &str) -> Vec<String> {
        self.errors
            .lock()
            .expect("errors")
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    /// Waits for the process to exit (within 30 s); its status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the readers take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not exit", self.name);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Fails (with what it printed) if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited ({status}): {:#?}",
                self.name,
                self.lines.lock().expect("lines")
            );
        }
    }

    /// SIGINT (a clean stop), then waits for the exit.
    pub fn interrupt(&mut self) {
        // SAFETY: kill(2) with SIGINT on our own unreaped child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGINT);
        }
        let _ = self.child.wait();
    }

    /// SIGSTOP: the process keeps its sockets and files but runs nothing
    /// (a hung disk or a descheduled host, as its peers see it).
    pub fn freeze(&mut self) {
        // SAFETY: kill(2) with SIGSTOP on our own unreaped child.
        let r = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGSTOP) };
        assert_eq!(r, 0, "SIGSTOP {}", self.name);
    }

    /// SIGCONT after [`Proc::freeze`].
    pub fn thaw(&mut self) {
        // SAFETY: kill(2) with SIGCONT on our own unreaped child.
        let r = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) };
        assert_eq!(r, 0, "SIGCONT {}", self.name);
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `done` until it holds; fails naming `what` once `within` has
/// passed. The pause between polls starts at 1 ms and doubles up to 50 ms,
/// so a quick condition is seen at once and a costly one (a store listed,
/// a host asked to close) is not run a thousand times a second.
pub fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(1);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Starts `n` `walrelay follower` processes under `root`, each knowing the
/// others as peers and authenticating with the key file `key`, and waits
/// until each accepts connections.
pub fn spawn_followers(root: &Path, n: usize, key: &Path) -> (Vec<Proc>, Vec<SocketAddr>) {
    let addrs: Vec<SocketAddr> = (0..n).map(|_| free_port()).collect();
    (spawn_followers_at(root, &addrs, key), addrs)
}

/// Starts (or restarts, on the same directories) follower `i` of `addrs`
/// for every address, as [`spawn_followers`] does.
pub fn spawn_followers_at(root: &Path, addrs: &[SocketAddr], key: &Path) -> Vec<Proc> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            let peers: Vec<SocketAddr> = addrs.iter().filter(|p| *p != addr).copied().collect();
            let mut args = vec![
                "follower".into(),
                "--listen".into(),
                addr.to_string(),
                "--dir".into(),
                root.join(format!("follower-{i}")).display().to_string(),
                "--peers".into(),
                join_addrs(&peers),
            ];
            args.extend(key_args(key));
            let mut p = Proc::spawn(&format!("follower {i}"), &args);
            p.wait_line("listening");
            wait_accepting(*addr, "a follower");
            p
        })
        .collect()
}

/// A follower's segment files (`DIR/log/*.seg`), in log order.
pub fn segment_files(follower_dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(follower_dir.join("log"))
        .expect("log dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}
