//! `walrelay up`: a local cluster of `walrelay` processes on 127.0.0.1
//! (followers, a primary running a demo workload, replicas), started in
//! order, reported on, and stopped primary first on Ctrl-C.

use crate::cmd::{CLUSTER_KEY_FILE, backend, backend_name, install_stop_handler, stopping};
use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use walrelay_replicator::ClusterKey;
use walrelay_replicator::net::Backend;

/// Options of `walrelay up`.
#[derive(clap::Args)]
pub struct UpArgs {
    /// Data directory (a fresh temporary one if omitted).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The primary listens here; followers on the next ports.
    #[arg(long, default_value_t = 7100)]
    pub base_port: u16,
    #[arg(long, default_value_t = 5)]
    pub followers: usize,
    #[arg(long, default_value_t = 2)]
    pub replicas: usize,
    /// Concurrent demo writers on the primary.
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Stop after this many seconds (0: run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// Transport: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub net: Backend,
    /// The largest write transaction, in bytes of pages (the primary's
    /// `--max-transaction-bytes`).
    #[arg(long, default_value_t = walrelay_engine::Limits::default().max_transaction_bytes)]
    pub max_transaction_bytes: u64,

    /// Serve the HTTP API without authentication (by default `up` keeps a
    /// token store in DIR/tokens and an admin token in DIR/token).
    #[arg(long)]
    pub insecure: bool,
}

fn addrs(base: u16, n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], base + i as u16)))
        .collect()
}

fn join(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on a child we spawned and have not reaped; the
        // worst case is a signal to an already exited child, which fails.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

pub fn up(a: UpArgs) -> Result<()> {
    install_stop_handler();
    if a.replicas > 26 {
        bail!("at most 26 replicas (regions region-a to region-z)");
    }
    // Followers take base+1..=base+N; HTTP takes base+10..=base+10+replicas.
    let highest = u32::from(a.base_port) + (a.followers as u32).max(10 + a.replicas as u32);
    if a.followers > 9 || highest > u32::from(u16::MAX) {
        bail!(
            "ports {}..={highest} do not fit (at most 9 followers, and a lower --base-port)",
            a.base_port
        );
    }
    let dir = match a.dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("walrelay-up-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let key_file = dir.join(CLUSTER_KEY_FILE);
    ClusterKey::load_or_create(&key_file)?;
    let key_arg = |args: &mut Vec<String>| {
        args.extend(["--cluster-key".into(), key_file.display().to_string()]);
    };
    let exe = std::env::current_exe()?;
    let follower_addrs = addrs(a.base_port + 1, a.followers);
    let primary_addr = SocketAddr::from(([127, 0, 0, 1], a.base_port));
    println!(
        "walrelay up: 1 primary, {} followers, {} replicas in {} (Ctrl-C stops); replication authenticated with {}",
        a.followers,
        a.replicas,
        dir.display(),
        key_file.display()
    );
    let auth_flags = crate::token_cmd::up_auth(&dir, a.insecure)?;
    let auth_header = if a.insecure {
        String::new()
    } else {
        format!(
            " -H \"Authorization: Bearer $(cat {})\"",
            dir.join("token").display()
        )
    };
    println!(
        "  try: curl -s -X POST http://127.0.0.1:{}/v1/databases/main/query{auth_header} -H 'x-d1-bookmark: first-unconstrained' -d '{{\"sql\":\"SELECT count(*) FROM events\"}}'",
        a.base_port + 11
    );
    let spawn = |args: Vec<String>| -> Result<Child> {
        let mut command = Command::new(&exe);
        command.args(&args);
        // Own process group: a terminal's Ctrl-C reaches only `up`, which
        // then stops the primary first (it waits for its last commits to be
        // confirmed, which needs the followers still up) and the rest after.
        command.process_group(0);
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only prctl(2), which is async-signal-safe; it asks the
        // kernel to SIGTERM the child if `up` dies without stopping it.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command
            .spawn()
            .with_context(|| format!("spawning {args:?}"))
    };
    let mut others = Vec::new();
    for (i, addr) in follower_addrs.iter().enumerate() {
        let peers: Vec<SocketAddr> = follower_addrs
            .iter()
            .filter(|p| *p != addr)
            .copied()
            .collect();
        let mut args = vec![
            "follower".into(),
            "--listen".into(),
            addr.to_string(),
            "--dir".into(),
            dir.join(format!("follower-{i}")).display().to_string(),
            "--peers".into(),
            join(&peers),
            "--net".into(),
            backend_name(a.net).into(),
        ];
        key_arg(&mut args);
        others.push(spawn(args)?);
    }
    // HTTP: the primary on base+10, replicas on base+11...
    let http = |i: u16| SocketAddr::from(([127, 0, 0, 1], a.base_port + 10 + i));
    let primary_http = format!("http://{}", http(0));
    let mut primary_args = vec![
        "primary".into(),
        "--http".into(),
        http(0).to_string(),
        "--dir".into(),
        dir.join("primary").display().to_string(),
        "--followers".into(),
        join(&follower_addrs),
        "--listen".into(),
        primary_addr.to_string(),
        "--demo-writers".into(),
        a.writers.to_string(),
        "--max-transaction-bytes".into(),
        a.max_transaction_bytes.to_string(),
        "--net".into(),
        backend_name(a.net).into(),
    ];
    if a.seconds > 0 {
        primary_args.extend(["--seconds".into(), a.seconds.to_string()]);
    }
    key_arg(&mut primary_args);
    primary_args.extend(auth_flags.iter().cloned());
    let mut primary = spawn(primary_args)?;
    for i in 0..a.replicas {
        let mut args: Vec<String> = vec![
            "replica".into(),
            "--http".into(),
            http(1 + i as u16).to_string(),
            "--primary-http".into(),
            primary_http.clone(),
            "--region".into(),
            format!("region-{}", (b'a' + i as u8) as char),
            "--dir".into(),
            dir.join(format!("replica-{i}")).display().to_string(),
            "--leader".into(),
            primary_addr.to_string(),
            "--followers".into(),
            join(&follower_addrs),
            "--net".into(),
            backend_name(a.net).into(),
        ];
        key_arg(&mut args);
        args.extend(auth_flags.iter().cloned());
        others.push(spawn(args)?);
    }
    // The primary ends the run (its --seconds, or a signal); the rest
    // follow it down.
    let status = loop {
        if stopping() {
            signal(&primary, libc::SIGINT);
            break wait_bounded(&mut primary, "the primary")?;
        }
        if let Some(s) = primary.try_wait()? {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for c in &others {
        signal(c, libc::SIGINT);
    }
    for mut c in others {
        let _ = wait_bounded(&mut c, "a follower or replica");
    }
    println!("walrelay up: stopped (data in {})", dir.display());
    if !status.success() {
        bail!("the primary exited with {status}");
    }
    Ok(())
}

/// How long `up` waits for a process it asked to stop before killing it.
const STOP_WAIT: Duration = Duration::from_secs(15);

/// Waits for a child asked to stop; past [`STOP_WAIT`] it is killed (a
/// hung process must not hang `up`).
fn wait_bounded(child: &mut Child, what: &str) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + STOP_WAIT;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            eprintln!(
                "walrelay up: {what} did not stop within {} s; killing it",
                STOP_WAIT.as_secs()
            );
            signal(child, libc::SIGKILL);
            return Ok(child.wait()?);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
