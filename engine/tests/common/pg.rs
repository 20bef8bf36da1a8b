//! A throwaway PostgreSQL server on 127.0.0.1 (Debian's postgresql
//! package; `.ci/run` installs it), started with its own data directory
//! and stopped by PID when dropped. Under root it runs as `postgres`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct PgServer {
    pub url: String,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

/// Where the server binaries are (None: PostgreSQL is not installed).
fn bindir() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists() && p.join("postgres").exists())
        .collect();
    found.sort();
    found.pop()
}

fn as_postgres(root: bool, bin: &Path, args: &[&str]) -> Command {
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin).args(args);
        c
    } else {
        let mut c = Command::new(bin);
        c.args(args);
        c
    }
}

impl PgServer {
    /// Starts a server, or None (with the reason printed) if PostgreSQL is
    /// not installed; under `CI=true` that is a failure instead.
    pub fn start() -> Option<PgServer> {
        let Some(bin) = bindir() else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "PostgreSQL is not installed (CI installs Debian's postgresql package)"
            );
            eprintln!("SKIPPED: PostgreSQL is not installed (apt-get install postgresql)");
            return None;
        };
        // SAFETY: geteuid(2) has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        if root {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success());
        }
        let data_s = data.display().to_string();
        let out = as_postgres(
            root,
            &bin.join("initdb"),
            &[
                "-D",
                &data_s,
                "-U",
                "walrelay",
                "--auth=trust",
                "-E",
                "UTF8",
            ],
        )
        .output()
        .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = super::free_port().port().to_string();
        let socket_dir = dir.path().display().to_string();
        let child = as_postgres(
            root,
            &bin.join("postgres"),
            &[
                "-D",
                &data_s,
                "-p",
                &port,
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                &format!("unix_socket_directories={socket_dir}"),
                "-c",
                "fsync=off",
            ],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("postgres starts");
        let url = format!("postgres://walrelay@127.0.0.1:{port}/postgres");
        let deadline = Instant::now() + Duration::from_secs(30);
        while postgres::Client::connect(&url, postgres::NoTls).is_err() {
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not accept connections"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(PgServer {
            url,
            child,
            _dir: dir,
        })
    }

    /// A fresh database on this server, for one test.
    pub fn database(&self, name: &str) -> String {
        let mut c = postgres::Client::connect(&self.url, postgres::NoTls).expect("connect");
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .expect("drop database");
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create database");
        self.url.replace("/postgres", &format!("/{name}"))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // The server's own PID is the first line of postmaster.pid (under
        // root the child is runuser, which need not pass signals on). A
        // SIGINT is PostgreSQL's "fast" shutdown; it is waited for so that
        // the data directory can go.
        let server_pid = std::fs::read_to_string(self._dir.path().join("data/postmaster.pid"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .next()
                    .and_then(|l| l.trim().parse::<libc::pid_t>().ok())
            });
        let child = libc::pid_t::try_from(self.child.id()).ok();
        for pid in server_pid.into_iter().chain(child) {
            // SAFETY: kill(2) on the server we started (or its runuser
            // parent); at worst it already exited.
            unsafe {
                libc::kill(pid, libc::SIGINT);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        if let Some(pid) = server_pid {
            // SAFETY: signal 0 only checks that the process exists.
            while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.wait();
    }
}
