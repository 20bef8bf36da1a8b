//! The supervisor behind `walrelay up`: keeps the local cluster's
//! processes running and replaces a primary that is gone.
//!
//! Detection: the primary's process exits with a failure (a crash, kill
//! -9, or a fenced primary's exit), or, once it has served, its HTTP port
//! stops accepting connections for [`LEASE`] (a hung or unreachable
//! process, which is then killed).
//!
//! Replacement: the replica whose persisted watermark is highest is
//! killed (it is crash-safe), its directory becomes a primary's at that watermark
//! ([`walrelay_engine::recovery::promote_replica`]) and a `walrelay primary` starts
//! on it, on the same replication address and on the replica's own HTTP
//! port. The new primary wins a newer epoch from the followers, rolls its
//! database forward to the end of their log and confirms its epoch's first
//! record before it serves. The old primary's node is rebuilt as a replica
//! from the log (its directory is wiped: it may hold writes the quorum
//! never confirmed). Replicas forward writes to whichever node answers as
//! the primary ([`walrelay_engine::http::forward`]), so they need no restart.
//!
//! Safety does not rest on any of this: a supervisor that is wrong about a
//! primary being gone only costs availability, because a primary that
//! lost its epoch can confirm nothing (papers/failover.md).

use crate::cmd::FENCED_EXIT_CODE;
use anyhow::{Context, Result};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How long a primary that served may not accept connections before it is
/// replaced.
pub const LEASE: Duration = Duration::from_millis(3_000);
/// How long `up` waits for a process it asked to stop before killing it.
pub const STOP_WAIT: Duration = Duration::from_secs(15);

/// A data node's place: its directory, HTTP port and region, whatever its
/// role.
#[derive(Debug, Clone)]
pub struct Slot {
    pub http: SocketAddr,
    pub dir: PathBuf,
    pub region: String,
}

/// What the supervisor needs to start nodes.
pub struct Plan {
    pub slots: Vec<Slot>,
    pub follower_addrs: Vec<SocketAddr>,
    /// Where the primary, whichever node it is, listens for replicas.
    pub primary_addr: SocketAddr,
    pub writers: usize,
    pub max_transaction_bytes: u64,
    /// False: the primary runs with `--no-group-commit`.
    pub group_commit: bool,
    pub group_commit_delay_us: u64,
    /// The primary's `--eager-followers` (None: its default).
    pub eager_followers: Option<usize>,
    /// The primary's `--confirm-timeout-ms`.
    pub confirm_timeout_ms: u64,
    pub net: &'static str,
    pub key_file: PathBuf,
    pub auth_flags: Vec<String>,
    pub dir: PathBuf,
    /// When the run ends (None: at Ctrl-C).
    pub deadline: Option<Instant>,
    /// The cold store's URL, for every node.
    pub store: String,
    /// The fleet's control plane (None: no fleet).
    pub fleet_control_url: Option<String>,
    /// Every HTTP node's base URL (data slots and fleet nodes): the
    /// fleet's routing entries go to all.
    pub http_urls: Vec<String>,
}

/// A data slot's fleet flags: where the control plane is, and its peers.
fn fleet_args(plan: &Plan, k: usize, args: &mut Vec<String>) {
    let Some(control) = &plan.fleet_control_url else {
        return;
    };
    let me = format!("http://{}", plan.slots[k].http);
    let peers: Vec<&str> = plan
        .http_urls
        .iter()
        .map(String::as_str)
        .filter(|u| *u != me)
        .collect();
    args.extend([
        "--fleet-control-url".into(),
        control.clone(),
        "--fleet-peers".into(),
        peers.join(","),
    ]);
}

type Spawn<'a> = dyn Fn(Vec<String>) -> Result<Child> + 'a;

/// A child process with the arguments to start it again.
pub struct Supervised {
    pub name: String,
    args: Vec<String>,
    child: Child,
    /// Where its process id is kept (for tests and tools).
    pid_file: PathBuf,
}

impl Supervised {
    /// Starts `args`; its pid goes to `pid_file`.
    pub fn start(
        name: String,
        args: Vec<String>,
        pid_file: PathBuf,
        spawn: &Spawn<'_>,
    ) -> Result<Supervised> {
        let child = spawn(args.clone())?;
        let _ = write_atomically(&pid_file, &child.id().to_string());
        Ok(Supervised {
            name,
            args,
            child,
            pid_file,
        })
    }

    fn restart(&mut self, spawn: &Spawn<'_>) -> Result<()> {
        self.child = spawn(self.args.clone())?;
        let _ = write_atomically(&self.pid_file, &self.child.id().to_string());
        Ok(())
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

pub fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on a child we spawned and have not reaped; the
        // worst case is a signal to an already exited child, which fails.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Waits for a child asked to stop; past [`STOP_WAIT`] it is killed (a
/// hung process must not hang `up`).
pub fn wait_bounded(child: &mut Child, what: &str) -> Result<ExitStatus> {
    wait_until(child, what, Instant::now() + STOP_WAIT, STOP_WAIT)
}

/// Waits for a child asked to stop until `deadline` (`waited` after it was
/// asked), then kills it.
fn wait_until(
    child: &mut Child,
    what: &str,
    deadline: Instant,
    waited: Duration,
) -> Result<ExitStatus> {
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            eprintln!(
                "walrelay up: {what} did not stop within {} s; killing it",
                waited.as_secs()
            );
            signal(child, libc::SIGKILL);
            return Ok(child.wait()?);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The running cluster.
pub struct Cluster {
    plan: Plan,
    followers: Vec<Supervised>,
    /// One process per slot; `primary` names the slot that leads.
    nodes: Vec<Supervised>,
    primary: usize,
    /// When the primary was last seen accepting HTTP (None: not yet).
    primary_seen: Option<Instant>,
    /// Primaries in a row that exited with an error before they ever
    /// served (not killed, not fenced): past
    /// [`Cluster::unserved_limit`] the run ends instead of failing over
    /// again (a start that fails on every slot, such as a bad option).
    unserved_failures: usize,
}

fn primary_slot_file(plan: &Plan) -> PathBuf {
    plan.dir.join("primary-slot")
}

/// `DIR/pids/slot-K`: the process id of the data node in slot K.
fn slot_pid_file(plan: &Plan, k: usize) -> PathBuf {
    pid_dir(&plan.dir).join(format!("slot-{k}"))
}

/// `DIR/pids`: one file per supervised process, holding its pid.
pub fn pid_dir(dir: &std::path::Path) -> PathBuf {
    dir.join("pids")
}

impl Cluster {
    /// Starts the data nodes (followers are already up): the primary in the
    /// slot DIR/primary-slot names (slot 0 at first), replicas elsewhere.
    pub fn start(plan: Plan, followers: Vec<Supervised>, spawn: &Spawn<'_>) -> Result<Cluster> {
        let primary = std::fs::read_to_string(primary_slot_file(&plan))
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|k| *k < plan.slots.len())
            .unwrap_or(0);
        let mut nodes = Vec::new();
        for k in 0..plan.slots.len() {
            let args = if k == primary {
                primary_args(&plan, k)
            } else {
                replica_args(&plan, k, primary)
            };
            nodes.push(Supervised::start(
                node_name(k, k == primary),
                args,
                slot_pid_file(&plan, k),
                spawn,
            )?);
        }
        let c = Cluster {
            plan,
            followers,
            nodes,
            primary,
            primary_seen: None,
            unserved_failures: 0,
        };
        c.write_pid();
        Ok(c)
    }

    /// Supervises until the run ends: Ctrl-C, or the primary finishing its
    /// `--seconds` cleanly. Returns the last primary's exit status.
    pub fn run(&mut self, spawn: &Spawn<'_>) -> Result<ExitStatus> {
        let mut last_probe = Instant::now();
        loop {
            if crate::cmd::stopping() {
                let p = &mut self.nodes[self.primary];
                signal(&p.child, libc::SIGINT);
                return wait_bounded(&mut p.child, "the primary");
            }
            if let Some(status) = self.nodes[self.primary].exited() {
                // A clean exit ends the run (its --seconds, or a stop sent
                // to it directly); anything else is a primary gone.
                if status.success() {
                    return Ok(status);
                }
                // An error exit before it ever served: a start that fails
                // (a kill or a crash by signal is what failover is for).
                let failed_start = self.primary_seen.is_none()
                    && status.code().is_some_and(|c| c != FENCED_EXIT_CODE);
                if !failed_start {
                    self.unserved_failures = 0;
                } else {
                    self.unserved_failures += 1;
                    if self.unserved_failures > self.unserved_limit() {
                        tracing::error!(
                            failures = self.unserved_failures,
                            "every primary failed before it served: giving up"
                        );
                        eprintln!(
                            "walrelay up: {} primaries in a row failed before they served (the last {status}); giving up (see their errors above)",
                            self.unserved_failures
                        );
                        return Ok(status);
                    }
                }
                let why = if status.code() == Some(FENCED_EXIT_CODE) {
                    "was fenced".to_string()
                } else {
                    format!("exited ({status})")
                };
                self.failover(&why, spawn)?;
                continue;
            }
            if last_probe.elapsed() >= Duration::from_millis(250) {
                last_probe = Instant::now();
                self.probe_primary();
            }
            for f in &mut self.followers {
                if let Some(status) = f.exited() {
                    eprintln!("walrelay up: {} exited ({status}); restarting it", f.name);
                    f.restart(spawn)?;
                }
            }
            for k in 0..self.nodes.len() {
                if k == self.primary {
                    continue;
                }
                if let Some(status) = self.nodes[k].exited() {
                    eprintln!(
                        "walrelay up: {} exited ({status}); restarting it",
                        self.nodes[k].name
                    );
                    self.nodes[k].restart(spawn)?;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many primaries in a row may fail before serving: every slot
    /// gets its chance, then one more.
    fn unserved_limit(&self) -> usize {
        self.nodes.len() + 1
    }

    /// The lease: a primary that served and then stops accepting for
    /// [`LEASE`] is killed (its replacement follows on the next round).
    fn probe_primary(&mut self) {
        let addr = self.plan.slots[self.primary].http;
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            self.primary_seen = Some(Instant::now());
        } else if self.primary_seen.is_some_and(|t| t.elapsed() >= LEASE) {
            eprintln!(
                "walrelay up: the primary has not accepted connections for {} ms; replacing it",
                LEASE.as_millis()
            );
            signal(&self.nodes[self.primary].child, libc::SIGKILL);
        }
    }

    /// Replaces a primary that is gone (see the module docs).
    fn failover(&mut self, why: &str, spawn: &Spawn<'_>) -> Result<()> {
        let started = Instant::now();
        let old = self.primary;
        let candidate = (0..self.nodes.len()).filter(|k| *k != old).max_by_key(|k| {
            walrelay_vfs::watermark::persisted_bookmark(
                &walrelay_engine::replication::database_path(&self.plan.slots[*k].dir),
            )
        });
        tracing::warn!(slot = old, why, "primary gone: failing over");
        let new = match candidate {
            Some(k) => {
                // Killed, not asked to stop: a replica is crash-safe (it
                // reopens at its persisted watermark), and a clean stop
                // would wait for its in-flight forwards, which are waiting
                // for the very primary this replaces.
                let n = &mut self.nodes[k];
                signal(&n.child, libc::SIGKILL);
                wait_bounded(&mut n.child, "the replica being promoted")?;
                match walrelay_engine::recovery::promote_replica(
                    &walrelay_engine::replication::database_path(&self.plan.slots[k].dir),
                ) {
                    Ok(_) => k,
                    Err(e) => {
                        eprintln!(
                            "walrelay up: could not promote slot {k} ({e}); restarting the old primary"
                        );
                        self.nodes[k].restart(spawn)?;
                        old
                    }
                }
            }
            None => old,
        };
        if new != old {
            // The old primary's files may hold writes the quorum never
            // confirmed: its node comes back as a replica rebuilt from the
            // log.
            let slot = &self.plan.slots[old];
            if slot.dir.exists() {
                std::fs::remove_dir_all(&slot.dir)
                    .with_context(|| format!("wiping {}", slot.dir.display()))?;
            }
            std::fs::create_dir_all(&slot.dir)?;
        }
        self.primary = new;
        self.primary_seen = None;
        write_atomically(&primary_slot_file(&self.plan), &new.to_string())?;
        self.nodes[new] = Supervised::start(
            node_name(new, true),
            primary_args(&self.plan, new),
            slot_pid_file(&self.plan, new),
            spawn,
        )?;
        if new != old {
            self.nodes[old] = Supervised::start(
                node_name(old, false),
                replica_args(&self.plan, old, new),
                slot_pid_file(&self.plan, old),
                spawn,
            )?;
        }
        self.write_pid();
        println!(
            "walrelay up: the primary (slot {old}) {why}; slot {new} takes over as primary on {} (started in {} ms)",
            self.plan.slots[new].http,
            started.elapsed().as_millis()
        );
        Ok(())
    }

    /// `DIR/primary.pid`: the primary's process id (for tests and tools).
    fn write_pid(&self) {
        let _ = write_atomically(
            &self.plan.dir.join("primary.pid"),
            &self.nodes[self.primary].child.id().to_string(),
        );
    }

    /// Stops every other process (the primary has stopped).
    pub fn stop(self) {
        let mut rest: Vec<Supervised> = Vec::new();
        for (k, n) in self.nodes.into_iter().enumerate() {
            if k != self.primary {
                rest.push(n);
            }
        }
        rest.extend(self.followers);
        let mut children: Vec<Child> = rest.into_iter().map(|s| s.child).collect();
        stop_side_by_side(&mut children, "a follower or replica", STOP_WAIT);
    }
}

/// Asks every child to stop (SIGINT) and waits for them with one deadline
/// for all, `wait` from now; a child still running then is killed. They
/// stop side by side, so a slow one costs its own wait, not one more wait
/// for every process after it.
fn stop_side_by_side(children: &mut [Child], what: &str, wait: Duration) {
    for c in children.iter() {
        signal(c, libc::SIGINT);
    }
    let deadline = Instant::now() + wait;
    for c in children.iter_mut() {
        let _ = wait_until(c, what, deadline, wait);
    }
}

fn node_name(slot: usize, primary: bool) -> String {
    format!(
        "{} (slot {slot})",
        if primary { "the primary" } else { "a replica" }
    )
}

fn write_atomically(path: &std::path::Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn common_args(plan: &Plan, args: &mut Vec<String>) {
    args.extend([
        "--followers".into(),
        plan.follower_addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(","),
        "--net".into(),
        plan.net.into(),
        "--cluster-key".into(),
        plan.key_file.display().to_string(),
        "--store".into(),
        plan.store.clone(),
    ]);
    args.extend(plan.auth_flags.iter().cloned());
}

fn primary_args(plan: &Plan, k: usize) -> Vec<String> {
    let slot = &plan.slots[k];
    let mut args = vec![
        "primary".into(),
        "--http".into(),
        slot.http.to_string(),
        "--region".into(),
        slot.region.clone(),
        "--dir".into(),
        slot.dir.display().to_string(),
        "--listen".into(),
        plan.primary_addr.to_string(),
        "--demo-writers".into(),
        plan.writers.to_string(),
        "--max-transaction-bytes".into(),
        plan.max_transaction_bytes.to_string(),
    ];
    if !plan.group_commit {
        args.push("--no-group-commit".into());
    }
    args.extend([
        "--group-commit-delay-us".into(),
        plan.group_commit_delay_us.to_string(),
    ]);
    args.extend([
        "--confirm-timeout-ms".into(),
        plan.confirm_timeout_ms.to_string(),
    ]);
    if let Some(n) = plan.eager_followers {
        args.extend(["--eager-followers".into(), n.to_string()]);
    }
    if let Some(d) = plan.deadline {
        let left = d.saturating_duration_since(Instant::now()).as_secs().max(1);
        args.extend(["--seconds".into(), left.to_string()]);
    }
    common_args(plan, &mut args);
    fleet_args(plan, k, &mut args);
    args
}

fn replica_args(plan: &Plan, k: usize, primary: usize) -> Vec<String> {
    let slot = &plan.slots[k];
    // Every other data node may be the primary; the current one first.
    let mut order: Vec<usize> = vec![primary];
    order.extend((0..plan.slots.len()).filter(|j| *j != primary && *j != k));
    let urls: Vec<String> = order
        .iter()
        .map(|j| format!("http://{}", plan.slots[*j].http))
        .collect();
    let mut args = vec![
        "replica".into(),
        "--http".into(),
        slot.http.to_string(),
        "--primary-http".into(),
        urls.join(","),
        "--region".into(),
        slot.region.clone(),
        "--dir".into(),
        slot.dir.display().to_string(),
        "--leader".into(),
        plan.primary_addr.to_string(),
    ];
    common_args(plan, &mut args);
    fleet_args(plan, k, &mut args);
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A child that ignores SIGINT (an ignored signal stays ignored
    /// across exec): only the kill stops it.
    fn stubborn() -> Child {
        Command::new("sh")
            .args(["-c", "trap '' INT; exec sleep 60"])
            .spawn()
            .expect("sh")
    }

    #[test]
    fn a_primary_that_fails_before_serving_on_every_slot_ends_the_run_instead_of_failing_over_forever()
     {
        let dir = tempfile::tempdir().expect("dir");
        // Nothing listens on port 1: no primary is ever seen serving.
        let unreachable: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let plan = Plan {
            slots: (0..2)
                .map(|k| Slot {
                    http: unreachable,
                    dir: dir.path().join(format!("slot-{k}")),
                    region: format!("region-{k}"),
                })
                .collect(),
            follower_addrs: vec![unreachable],
            primary_addr: unreachable,
            writers: 0,
            max_transaction_bytes: 1 << 20,
            group_commit: true,
            group_commit_delay_us: 0,
            eager_followers: None,
            confirm_timeout_ms: 5_000,
            net: "std",
            key_file: dir.path().join("key"),
            auth_flags: Vec::new(),
            dir: dir.path().to_path_buf(),
            deadline: None,
            store: String::new(),
            fleet_control_url: None,
            http_urls: Vec::new(),
        };
        std::fs::create_dir_all(pid_dir(&plan.dir)).expect("pids");
        // Every primary exits at once with an error; replicas just wait.
        let spawn = |args: Vec<String>| -> Result<Child> {
            let script = if args[0] == "primary" {
                "exit 1"
            } else {
                "exec sleep 60"
            };
            Ok(Command::new("sh").args(["-c", script]).spawn()?)
        };
        let mut cluster = Cluster::start(plan, Vec::new(), &spawn).expect("start");
        let started = Instant::now();
        let status = cluster.run(&spawn).expect("run");
        assert!(!status.success());
        assert_eq!(cluster.unserved_failures, cluster.unserved_limit() + 1);
        assert!(started.elapsed() < Duration::from_secs(30));
        cluster.stop();
    }

    #[test]
    fn processes_that_will_not_stop_share_one_deadline_and_are_killed() {
        let mut children: Vec<Child> = (0..4).map(|_| stubborn()).collect();
        // Give each shell time to install its trap.
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        stop_side_by_side(&mut children, "a stubborn child", Duration::from_secs(1));
        let took = started.elapsed();
        for c in &mut children {
            assert!(c.try_wait().expect("wait").is_some(), "killed and reaped");
        }
        // One wait for all of them, not four waits in a row.
        assert!(took < Duration::from_secs(3), "took {took:?}");
    }
}
