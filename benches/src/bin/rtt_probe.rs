//! The measuring side of benches/scripts/rtt_lag.sh (confirm lag and
//! commit latency against network distance). Each subcommand prints one
//! line of `key=value` fields for the script to collect.
//!
//! ```text
//! rtt_probe floor DIR ITERATIONS         fsync and shared-disk floors in DIR
//! rtt_probe echo LISTEN                  echo server (measures a path)
//! rtt_probe ping ADDR ITERATIONS         round trips to an echo server
//! rtt_probe ping A,B,.. ITERATIONS       round trips to several at once
//!     (one thread each, started together): each round's W-th quickest
//!     (W = 3), what a quorum of followers that far away waits for
//! rtt_probe load HOST:PORT SECONDS LAG_LOG
//!     one client: INSERTs of 100 bytes, one per transaction, to the
//!     primary's HTTP API for SECONDS; reports its commit latency, the
//!     HTTP floor (`SELECT 1` on the same connection) and the confirm
//!     lags the replica appended to LAG_LOG while it ran; with
//!     RTT_PROBE_COMMITS_TO=FILE set, also each timed commit's latency
//!     (µs, one a line, in order, after the warm-up's) to FILE
//! rtt_probe visible PRIMARY REPLICA SECONDS
//!     commit-ack -> visible: INSERT on the primary, then at once read
//!     that row on the replica with the INSERT's bookmark; reports the
//!     share of first reads that saw it and the time from the INSERT's
//!     answer to the replica's
//! rtt_probe read REPLICA SECONDS
//!     replica point read against its HTTP floor: on one connection, a
//!     `SELECT 1` and a point read of a random key of table `kv`
//!     alternate for SECONDS, so both see the same machine load
//! rtt_probe pair A B SECONDS
//!     two servers' HTTP floors (two builds, say): one connection to each,
//!     `SELECT 1` sent to A and B in turn for SECONDS; reports both p50s
//!     and B/A, so a change in the HTTP path is judged under one load
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};
use walrelay_benches::floor::{
    Durably, Percentiles, concurrent_durable_overwrite, durable_overwrite, percentiles,
};

/// Size of one follower log write in the floor: a commit of one small
/// INSERT is one page plus headers, well under a 4 KiB block.
const FLOOR_WRITE_BYTES: usize = 4096;
/// Followers and write quorum of the cluster the script starts.
const FOLLOWERS: usize = 5;
const QUORUM: usize = 3;
/// Unmeasured commits first: connection, statement cache, page cache.
const WARMUP: Duration = Duration::from_secs(1);
/// The replica appends its lag samples about once a second: waiting this
/// long puts every sample of a phase in the file before it is read.
const LAG_FLUSH: Duration = Duration::from_millis(1_500);
/// A reply slower than this fails the run rather than hanging it.
/// The measured write: one row of 100 random bytes (as the other benches).
const INSERT_BODY: &str = r#"{"sql":"INSERT INTO w(v) VALUES (randomblob(100))"}"#;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = match args.as_slice() {
        ["floor", dir, iters] => floor(Path::new(dir), iters.parse().unwrap_or(0)),
        ["echo", listen] => echo(listen),
        ["ping", addr, iters] => ping(addr, iters.parse().unwrap_or(0)),
        ["load", addr, secs, lag_log] => load(addr, secs.parse().unwrap_or(0), Path::new(lag_log)),
        ["visible", primary, replica, secs] => visible(primary, replica, secs.parse().unwrap_or(0)),
        ["read", replica, secs] => read(replica, secs.parse().unwrap_or(0)),
        ["pair", a, b, secs] => pair(a, b, secs.parse().unwrap_or(0)),
        _ => Err("usage: rtt_probe floor DIR N | echo LISTEN | ping ADDR[,ADDR..] N | load HOST:PORT SECONDS LAG_LOG | visible PRIMARY REPLICA SECONDS | read REPLICA SECONDS | pair A B SECONDS".into()),
    };
    if let Err(e) = r {
        eprintln!("rtt_probe: {e}");
        std::process::exit(1);
    }
}

fn us(p: &Percentiles) -> (u64, u64) {
    (p.p50_us.round() as u64, p.p99_us.round() as u64)
}

fn floor(dir: &Path, iters: usize) -> Result<()> {
    if iters == 0 {
        return Err("ITERATIONS must be > 0".into());
    }
    let (f50, f99) = us(&percentiles(&mut durable_overwrite(
        dir,
        FLOOR_WRITE_BYTES,
        iters,
    )?));
    // The followers share this machine's one disk: the W-th of five
    // concurrent flushes is what a quorum can wait for at best.
    let (s50, s99) = us(&percentiles(&mut concurrent_durable_overwrite(
        dir,
        FLOOR_WRITE_BYTES,
        FOLLOWERS,
        QUORUM,
        iters,
        Durably::Fdatasync,
    )?));
    println!(
        "fsync_p50_us={f50} fsync_p99_us={f99} shared_disk_p50_us={s50} shared_disk_p99_us={s99}"
    );
    Ok(())
}

fn echo(listen: &str) -> Result<()> {
    let listener = TcpListener::bind(listen.parse::<SocketAddr>()?)?;
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        std::thread::spawn(move || {
            let _ = conn.set_nodelay(true);
            let mut buf = [0u8; 4096];
            while let Ok(n) = conn.read(&mut buf) {
                if n == 0 || conn.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
    Ok(())
}

fn ping(addrs: &str, iters: usize) -> Result<()> {
    if iters == 0 {
        return Err("ITERATIONS must be > 0".into());
    }
    let addrs: Vec<&str> = addrs.split(',').collect();
    if addrs.len() == 1 {
        let mut samples = round_trips(addrs[0], iters, None)?;
        let (p50, p99) = us(&percentiles(&mut samples));
        println!("path_rtt_p50_us={p50} path_rtt_p99_us={p99}");
        return Ok(());
    }
    if addrs.len() < QUORUM {
        return Err(format!(
            "{} paths: the W-th of them needs at least {QUORUM}",
            addrs.len()
        )
        .into());
    }
    // Every path's round trips in lockstep: each round starts on all of
    // them at once, as a record's Appends go out to its followers.
    let start = std::sync::Barrier::new(addrs.len());
    let per_path: Vec<Vec<Duration>> = std::thread::scope(|s| {
        let threads: Vec<_> = addrs
            .iter()
            .map(|a| {
                let start = &start;
                s.spawn(move || round_trips(a, iters, Some(start)).map_err(|e| e.to_string()))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| "a ping thread panicked".to_string())?)
            .collect::<std::result::Result<_, String>>()
    })?;
    let mut wth: Vec<Duration> = (0..iters)
        .map(|i| {
            let mut round: Vec<Duration> = per_path.iter().map(|p| p[i]).collect();
            round.sort();
            round[QUORUM - 1]
        })
        .collect();
    let (p50, p99) = us(&percentiles(&mut wth));
    println!("wth_rtt_p50_us={p50} wth_rtt_p99_us={p99}");
    Ok(())
}

/// `iters` timed round trips of 64 bytes to the echo server at `addr`
/// (after three untimed ones), each round started at `start` if given.
fn round_trips(
    addr: &str,
    iters: usize,
    start: Option<&std::sync::Barrier>,
) -> Result<Vec<Duration>> {
    let mut s = TcpStream::connect(addr.parse::<SocketAddr>()?)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    let msg = [7u8; 64];
    let mut back = [0u8; 64];
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + 3 {
        if let Some(b) = start {
            b.wait();
        }
        let t = Instant::now();
        s.write_all(&msg)?;
        s.read_exact(&mut back)?;
        // The first few include the proxy's dial to the echo server.
        if i >= 3 {
            samples.push(t.elapsed());
        }
    }
    Ok(samples)
}

/// One keep-alive HTTP/1.1 connection to a walrelay node, without auth
/// (the script runs the primary `--insecure` on loopback).
struct Http {
    host: String,
    reader: BufReader<TcpStream>,
}

impl Http {
    fn connect(addr: &str) -> Result<Http> {
        let s = TcpStream::connect(addr.parse::<SocketAddr>()?)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        Ok(Http {
            host: addr.to_string(),
            reader: BufReader::new(s),
        })
    }

    /// POSTs a query; the status and body of the answer.
    fn query(&mut self, json: &str) -> Result<(u16, String)> {
        self.query_at(json, None)
    }

    /// POSTs a query in the session at `bookmark` (the D1 header), if any.
    fn query_at(&mut self, json: &str, bookmark: Option<&str>) -> Result<(u16, String)> {
        let session = bookmark.map_or(String::new(), |b| format!("x-d1-bookmark: {b}\r\n"));
        let head = format!(
            "POST /v1/databases/main/query HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n{session}content-length: {}\r\n\r\n",
            self.host,
            json.len()
        );
        let s = self.reader.get_mut();
        s.write_all(format!("{head}{json}").as_bytes())?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {line:?}"))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (name, value) = l.split_once(':').unwrap_or((l, ""));
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.parse::<usize>()?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim(), 16)?;
                let mut chunk = vec![0u8; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            body.resize(length.ok_or("no content-length")?, 0);
            self.reader.read_exact(&mut body)?;
        }
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// A query that must succeed.
    fn ok(&mut self, json: &str) -> Result<()> {
        match self.query(json)? {
            (200, _) => Ok(()),
            (status, body) => Err(format!("HTTP {status}: {body}").into()),
        }
    }
}

fn load(addr: &str, seconds: u64, lag_log: &Path) -> Result<()> {
    if seconds == 0 {
        return Err("SECONDS must be > 0".into());
    }
    let mut http = Http::connect(addr)?;
    http.ok(r#"{"sql":"CREATE TABLE IF NOT EXISTS w(id INTEGER PRIMARY KEY, v TEXT NOT NULL)"}"#)?;
    let select = r#"{"sql":"SELECT 1"}"#;
    let started = Instant::now();
    while started.elapsed() < WARMUP {
        http.ok(INSERT_BODY)?;
    }
    // Lag samples of the warm-up are left out: measured ones start after
    // what the file holds once the replica has flushed the warm-up's.
    std::thread::sleep(LAG_FLUSH);
    let lag_from = std::fs::metadata(lag_log).map(|m| m.len()).unwrap_or(0);
    let mut commits = Vec::new();
    let mut floor = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        // The floor interleaved with the commits, so both see the same
        // machine load over the run.
        let t = Instant::now();
        http.ok(select)?;
        floor.push(t.elapsed());
        let t = Instant::now();
        http.ok(INSERT_BODY)?;
        commits.push(t.elapsed());
    }
    if let Some(path) = std::env::var_os("RTT_PROBE_COMMITS_TO").filter(|p| !p.is_empty()) {
        let lines: String = commits
            .iter()
            .map(|c| format!("{}\n", c.as_micros()))
            .collect();
        std::fs::write(path, lines)?;
    }
    std::thread::sleep(LAG_FLUSH);
    let mut lags: Vec<Duration> = std::fs::read_to_string(lag_log)?
        .get(lag_from as usize..)
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .map(Duration::from_micros)
        .collect();
    let (c50, c99) = us(&percentiles(&mut commits));
    let (h50, h99) = us(&percentiles(&mut floor));
    let (l50, l99) = if lags.is_empty() {
        return Err(format!("no confirm lag samples in {}", lag_log.display()).into());
    } else {
        us(&percentiles(&mut lags))
    };
    println!(
        "commits={} commit_p50_us={c50} commit_p99_us={c99} http_floor_p50_us={h50} http_floor_p99_us={h99} lags={} lag_p50_us={l50} lag_p99_us={l99}",
        commits.len(),
        lags.len()
    );
    Ok(())
}

/// The string or number after `"key":` in a JSON answer (the first one).
fn json_field<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    let at = body.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = body[at..].trim_start();
    match rest.strip_prefix('"') {
        Some(s) => s.split('"').next(),
        None => rest.split([',', '}']).next().map(str::trim),
    }
}

fn visible(primary: &str, replica: &str, seconds: u64) -> Result<()> {
    if seconds == 0 {
        return Err("SECONDS must be > 0".into());
    }
    let mut p = Http::connect(primary)?;
    let mut r = Http::connect(replica)?;
    p.ok(r#"{"sql":"CREATE TABLE IF NOT EXISTS w(id INTEGER PRIMARY KEY, v TEXT NOT NULL)"}"#)?;
    let (mut seen, mut total) = (0u64, 0u64);
    let mut ack_to_visible = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        let (status, body) = p.query(INSERT_BODY)?;
        let acked = Instant::now();
        if status != 200 {
            return Err(format!("INSERT: HTTP {status}: {body}").into());
        }
        let bookmark = json_field(&body, "bookmark").ok_or("no bookmark in the answer")?;
        let id = json_field(&body, "last_row_id").ok_or("no last_row_id in the answer")?;
        let read = format!(r#"{{"sql":"SELECT count(*) AS n FROM w WHERE id = {id}"}}"#);
        let (status, body) = r.query_at(&read, Some(bookmark))?;
        if status != 200 {
            return Err(format!("replica read: HTTP {status}: {body}").into());
        }
        total += 1;
        if json_field(&body, "n") == Some("1") {
            seen += 1;
            ack_to_visible.push(acked.elapsed());
        }
    }
    let (v50, v99) = us(&percentiles(&mut ack_to_visible));
    println!(
        "commits={total} visible_first_read={seen} visible_pct={:.2} ack_to_visible_p50_us={v50} ack_to_visible_p99_us={v99}",
        100.0 * seen as f64 / total.max(1) as f64
    );
    Ok(())
}

/// `SELECT 1` on A and on B in turn, one connection each (see the module
/// docs).
fn pair(a: &str, b: &str, seconds: u64) -> Result<()> {
    if seconds == 0 {
        return Err("SECONDS must be > 0".into());
    }
    let (mut ca, mut cb) = (Http::connect(a)?, Http::connect(b)?);
    let select = r#"{"sql":"SELECT 1"}"#;
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    let started = Instant::now();
    while started.elapsed() < WARMUP + Duration::from_secs(seconds) {
        let t = Instant::now();
        ca.ok(select)?;
        let da = t.elapsed();
        let t = Instant::now();
        cb.ok(select)?;
        let db = t.elapsed();
        if started.elapsed() > WARMUP {
            ta.push(da);
            tb.push(db);
        }
    }
    let (a50, a99) = us(&percentiles(&mut ta));
    let (b50, b99) = us(&percentiles(&mut tb));
    println!(
        "requests={} a_p50_us={a50} a_p99_us={a99} b_p50_us={b50} b_p99_us={b99} ratio_p50={:.3}",
        ta.len(),
        b50 as f64 / a50.max(1) as f64
    );
    Ok(())
}

fn read(replica: &str, seconds: u64) -> Result<()> {
    if seconds == 0 {
        return Err("SECONDS must be > 0".into());
    }
    let mut r = Http::connect(replica)?;
    let (status, body) = r.query(r#"{"sql":"SELECT max(id) AS n FROM kv"}"#)?;
    if status != 200 {
        return Err(format!("replica: HTTP {status}: {body}").into());
    }
    let rows: u64 = json_field(&body, "n")
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .ok_or("table kv is empty")?;
    let select = r#"{"sql":"SELECT 1"}"#;
    // xorshift64: keys spread over the whole table, the same each run.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let (mut floor, mut point) = (Vec::new(), Vec::new());
    let started = Instant::now();
    while started.elapsed() < WARMUP + Duration::from_secs(seconds) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = 1 + x % rows;
        let read = format!(r#"{{"sql":"SELECT v FROM kv WHERE id = ?1","params":[{key}]}}"#);
        let t = Instant::now();
        r.ok(select)?;
        let f = t.elapsed();
        let t = Instant::now();
        r.ok(&read)?;
        let p = t.elapsed();
        // The warm-up is left out: connection, statement cache, page cache.
        if started.elapsed() > WARMUP {
            floor.push(f);
            point.push(p);
        }
    }
    let (f50, f99) = us(&percentiles(&mut floor));
    let (p50, p99) = us(&percentiles(&mut point));
    println!(
        "reads={} rows={rows} floor_p50_us={f50} floor_p99_us={f99} point_p50_us={p50} point_p99_us={p99} ratio_p50={:.2}",
        point.len(),
        p50 as f64 / f50.max(1) as f64
    );
    Ok(())
}
