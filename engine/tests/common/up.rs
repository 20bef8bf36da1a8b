//! `walrelay up` as a test fixture: the README's main command run as a
//! real process tree, with its HTTP ports, its printed lines, a Ctrl-C
//! stop and restarts from the same directory.

use serde_json::Value as Json;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A base port with every port `up` derives from it free: the primary and
/// followers use base..=base+5, HTTP base+10..=base+12, the fleet nodes
/// base+13..=base+15.
pub fn free_base() -> u16 {
    super::free_port_base(16)
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub bookmark: Option<String>,
    pub json: Json,
}

/// A running `walrelay up`.
pub struct Up {
    child: Option<Child>,
    pub dir: PathBuf,
    pub base: u16,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    agent: ureq::Agent,
}

impl Up {
    /// Starts `walrelay up --dir dir --base-port base` plus `extra` args.
    pub fn start(dir: &Path, base: u16, extra: &[&str]) -> Up {
        let mut child = Command::new(env!("CARGO_BIN_EXE_walrelay"))
            .args(["up", "--dir", &dir.display().to_string()])
            .args(["--base-port", &base.to_string()])
            .args(extra)
            .env("RUST_BACKTRACE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn walrelay up");
        // Both streams, line by line, into one channel.
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(line);
            }
        });
        Up {
            child: Some(child),
            dir: dir.to_path_buf(),
            base,
            lines: rx,
            seen: Vec::new(),
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(300)))
                .http_status_as_error(false)
                .build()
                .new_agent(),
        }
    }

    /// The HTTP base URL of node `i`: 0 the primary, 1.. the replicas.
    pub fn http(&self, i: u16) -> String {
        format!("http://127.0.0.1:{}", self.base + 10 + i)
    }

    /// The admin token `up` wrote, when it runs with authentication.
    pub fn token(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("token"))
            .ok()
            .map(|t| t.trim().to_string())
    }

    /// Waits for a printed line matching `pred`.
    pub fn wait_line(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => panic!("up never printed {what}: {:#?}", self.seen),
            }
        }
    }

    /// POSTs a D1 query body to node `i` with the admin token (when `up`
    /// wrote one).
    pub fn query(&self, i: u16, bookmark: &str, body: &Json) -> Reply {
        self.query_as(i, bookmark, body, self.token().as_deref())
    }

    /// POSTs a D1 query body to node `i` with `token` (None: no
    /// credentials).
    pub fn query_as(&self, i: u16, bookmark: &str, body: &Json, token: Option<&str>) -> Reply {
        post(&self.agent, &self.http(i), bookmark, body, token)
    }

    /// POSTs a D1 query body for `database` (a fleet database's name or
    /// uuid) to node `i`, with the admin token and a session bookmark.
    pub fn query_db(&self, i: u16, database: &str, bookmark: &str, body: &Json) -> Reply {
        post_to(
            &self.agent,
            &self.http(i),
            database,
            bookmark,
            body,
            self.token().as_deref(),
        )
    }

    /// Any call to node `i` (0 the primary, 1.. the replicas, then the
    /// fleet nodes) with the admin token: `method` GET, POST or DELETE.
    pub fn call(&self, i: u16, method: &str, path: &str, body: Option<&Json>) -> Reply {
        let url = format!("{}{path}", self.http(i));
        let auth = self
            .token()
            .map(|t| format!("Bearer {t}"))
            .unwrap_or_default();
        let sent = match method {
            "POST" => self
                .agent
                .post(&url)
                .header("authorization", &auth)
                .send_json(body.cloned().unwrap_or(Json::Null)),
            "DELETE" => self
                .agent
                .delete(&url)
                .header("authorization", &auth)
                .call(),
            _ => self.agent.get(&url).header("authorization", &auth).call(),
        };
        match sent {
            Ok(mut resp) => Reply {
                status: resp.status().as_u16(),
                bookmark: None,
                json: resp.body_mut().read_json().unwrap_or(Json::Null),
            },
            Err(e) => Reply {
                status: 0,
                bookmark: None,
                json: Json::String(e.to_string()),
            },
        }
    }

    /// POSTs `body` as is to node `i`'s `path` with the admin token; the
    /// answer's status and text (an export's SQL, say).
    pub fn post_text(&self, i: u16, path: &str, body: &str) -> (u16, String) {
        let mut req = self.agent.post(format!("{}{path}", self.http(i)));
        if let Some(t) = self.token() {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        match req.send(body.as_bytes()) {
            Ok(mut resp) => (
                resp.status().as_u16(),
                resp.body_mut().read_to_string().unwrap_or_default(),
            ),
            Err(e) => (0, e.to_string()),
        }
    }

    /// Node `i`'s metric `name`, read with the admin token.
    pub fn metric(&self, i: u16, name: &str) -> Option<u64> {
        let mut req = self.agent.get(format!("{}/metrics", self.http(i)));
        if let Some(t) = self.token() {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        let text = req.call().ok()?.body_mut().read_to_string().ok()?;
        super::metric_in(&text, name)
    }

    /// A handle that queries the nodes from other threads.
    pub fn client(&self) -> UpClient {
        UpClient {
            base: self.base,
            token: self.token(),
            agent: self.agent.clone(),
        }
    }

    /// Waits until every node answers a query (`replicas` replicas).
    pub fn wait_serving(&mut self, replicas: u16, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let body = serde_json::json!({ "sql": "SELECT 1" });
        for i in 0..=replicas {
            while self.query(i, "first-unconstrained", &body).status != 200 {
                self.seen.extend(self.lines.try_iter());
                assert!(
                    Instant::now() < deadline,
                    "node {i} never served: {:#?}",
                    self.seen
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// What a terminal's Ctrl-C does: SIGINT to `up`'s process group. Returns
    /// the exit status and every line printed.
    pub fn interrupt(self) -> (ExitStatus, Vec<String>) {
        let (status, lines, _) = self.interrupt_timed();
        (status, lines)
    }

    /// As [`Up::interrupt`], also returning how long `up` took to exit.
    pub fn interrupt_timed(mut self) -> (ExitStatus, Vec<String>, Duration) {
        let mut child = self.child.take().expect("running");
        let sent = Instant::now();
        // SAFETY: kill(2) with SIGINT on the process group our child leads.
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGINT);
        }
        // Bounded: a hang is a failure, not a stuck test.
        let deadline = sent + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                // Every line up to now, so the failure shows which
                // process was still stopping.
                self.seen.extend(self.lines.try_iter());
                panic!("up did not stop within 60 s of Ctrl-C: {:#?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = sent.elapsed();
        std::thread::sleep(Duration::from_millis(200));
        self.seen.extend(self.lines.try_iter());
        (status, std::mem::take(&mut self.seen), took)
    }

    /// The scheduling policy (`SCHED_*`) of every thread of every process
    /// `up` supervises (`DIR/pids`), with the pid file's name and the
    /// thread's; a process gone meanwhile is skipped. Read from
    /// `/proc/PID/task/TID/stat`.
    pub fn thread_policies(&self) -> Vec<ThreadPolicy> {
        let mut out = Vec::new();
        let pids = std::fs::read_dir(self.dir.join("pids")).expect("DIR/pids");
        for entry in pids.map_while(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(pid) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", pid.trim())) else {
                continue;
            };
            for task in tasks.map_while(Result::ok) {
                let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                    continue;
                };
                // The name is parenthesised (field 2); after it, state is
                // field 3 and the policy field 41.
                let open = stat.find('(').expect("stat");
                let close = stat.rfind(')').expect("stat");
                let after = &stat[close + 2..];
                let policy = after.split(' ').nth(41 - 3).expect("policy field");
                out.push(ThreadPolicy {
                    process: name.clone(),
                    thread: stat[open + 1..close].to_string(),
                    policy: policy.parse().expect("policy"),
                });
            }
        }
        out
    }

    /// Every line printed so far.
    pub fn drain(&mut self) -> &[String] {
        self.seen.extend(self.lines.try_iter());
        &self.seen
    }
}

/// Queries `up`'s nodes with its admin token; cheap to clone, usable from
/// any thread.
#[derive(Clone)]
pub struct UpClient {
    base: u16,
    token: Option<String>,
    agent: ureq::Agent,
}

impl UpClient {
    /// As [`Up::query`].
    pub fn query(&self, i: u16, bookmark: &str, body: &Json) -> Reply {
        let url = format!("http://127.0.0.1:{}", self.base + 10 + i);
        post(&self.agent, &url, bookmark, body, self.token.as_deref())
    }
}

fn post(
    agent: &ureq::Agent,
    node: &str,
    bookmark: &str,
    body: &Json,
    token: Option<&str>,
) -> Reply {
    post_to(agent, node, "main", bookmark, body, token)
}

fn post_to(
    agent: &ureq::Agent,
    node: &str,
    database: &str,
    bookmark: &str,
    body: &Json,
    token: Option<&str>,
) -> Reply {
    let mut req = agent
        .post(format!("{node}/v1/databases/{database}/query"))
        .header("x-d1-bookmark", bookmark);
    if let Some(t) = token {
        req = req.header("authorization", &format!("Bearer {t}"));
    }
    match req.send_json(body) {
        Ok(mut resp) => Reply {
            status: resp.status().as_u16(),
            bookmark: resp
                .headers()
                .get("x-d1-bookmark")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            json: resp.body_mut().read_json().unwrap_or(Json::Null),
        },
        Err(e) => Reply {
            status: 0,
            bookmark: None,
            json: Json::String(e.to_string()),
        },
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: SIGKILL to the process group our child leads.
            unsafe {
                libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = c.wait();
        }
    }
}

/// Calls `f` until it returns an answer, at most `timeout_s` seconds.
pub fn until(what: &str, timeout_s: u64, mut f: impl FnMut() -> Option<Reply>) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(Instant::now() < deadline, "{what}: timed out");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `sig` to the `up` process whose pid is in `DIR/pids/{pid_file}`
/// (`node-1`, `slot-1`, `follower-0`, ...).
pub fn signal(dir: &Path, pid_file: &str, sig: i32) {
    let pid: i32 = std::fs::read_to_string(dir.join("pids").join(pid_file))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) takes plain integers; the pid is one of this test's
    // cluster's processes.
    let sent = unsafe { libc::kill(pid, sig) };
    assert_eq!(sent, 0, "signal {sig} to {pid_file}");
}

/// One thread's scheduling policy (see [`Up::thread_policies`]).
#[derive(Debug)]
pub struct ThreadPolicy {
    /// The pid file's name (`follower-0`, `primary`, ...).
    pub process: String,
    /// The thread's name (`comm`, at most 15 bytes).
    pub thread: String,
    /// `SCHED_*`.
    pub policy: i32,
}
