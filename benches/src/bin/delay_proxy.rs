//! A TCP forwarder that delays every byte by a fixed one-way time in each
//! direction, standing in for network distance on a kernel without netem
//! (benches/scripts/rtt_lag.sh; papers/performance.md, "Confirm lag against
//! distance").
//!
//! ```text
//! delay_proxy DELAY_US LISTEN=TARGET [LISTEN=TARGET ...]
//! ```
//!
//! Each accepted connection is paired with a fresh one to TARGET. Per
//! direction, a reader stamps each chunk it reads with "due = now + delay"
//! and queues it; a writer sends each chunk at its due time. Chunks keep
//! their order and are not held for each other, so the stream flows (a
//! chunk read 1 ms after another leaves 1 ms after it), and a round trip
//! through the proxy costs 2 × DELAY_US plus the forwarding. The queue is
//! bounded ([`QUEUE_CHUNKS`] chunks of at most [`CHUNK_BYTES`]): a sender
//! faster than that is held back by TCP flow control, like a link with a
//! bandwidth-delay product, instead of growing memory.
//!
//! Runs until killed; every connection ends when either side closes.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::{Duration, Instant};

/// The most bytes one read takes (one queued chunk).
const CHUNK_BYTES: usize = 64 << 10;
/// Chunks queued per direction and connection: at most 16 MiB in flight,
/// far more than a replication stream of small commits needs within one
/// delay, so the bound only matters for bulk catch-up.
const QUEUE_CHUNKS: usize = 256;

/// One read's bytes and when they may leave; None data is the end of the
/// stream (the reader saw EOF or an error).
struct Chunk {
    due: Instant,
    data: Option<Vec<u8>>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: delay_proxy DELAY_US LISTEN=TARGET [LISTEN=TARGET ...]";
    let Some((delay, routes)) = args.split_first() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let delay = Duration::from_micros(delay.parse().unwrap_or_else(|e| {
        eprintln!("delay_proxy: DELAY_US {delay:?}: {e}\n{usage}");
        std::process::exit(2);
    }));
    if routes.is_empty() {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let mut acceptors = Vec::new();
    for route in routes {
        let parsed = route.split_once('=').and_then(|(l, t)| {
            Some((l.parse::<SocketAddr>().ok()?, t.parse::<SocketAddr>().ok()?))
        });
        let Some((listen, target)) = parsed else {
            eprintln!("delay_proxy: bad route {route:?}\n{usage}");
            std::process::exit(2);
        };
        // Bound before any thread starts, so that a port in use fails the
        // start (and the script) at once rather than a later dial.
        let listener = TcpListener::bind(listen).unwrap_or_else(|e| {
            eprintln!("delay_proxy: listening on {listen}: {e}");
            std::process::exit(1);
        });
        acceptors.push(std::thread::spawn(move || accept(listener, target, delay)));
    }
    println!(
        "delay_proxy: {} routes, {} µs each way",
        routes.len(),
        delay.as_micros()
    );
    for a in acceptors {
        let _ = a.join();
    }
}

fn accept(listener: TcpListener, target: SocketAddr, delay: Duration) {
    for inbound in listener.incoming() {
        let inbound = match inbound {
            Ok(s) => s,
            Err(e) => {
                eprintln!("delay_proxy: accept: {e}");
                continue;
            }
        };
        // The dial is not delayed: replication connections are long-lived,
        // and what is measured is the traffic on them.
        let outbound = match TcpStream::connect(target) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("delay_proxy: dialing {target}: {e}");
                continue;
            }
        };
        if let Err(e) = pair(inbound, outbound, delay) {
            eprintln!("delay_proxy: starting a connection to {target}: {e}");
        }
    }
}

/// Starts both directions of one proxied connection.
fn pair(a: TcpStream, b: TcpStream, delay: Duration) -> std::io::Result<()> {
    // Without NODELAY, Nagle would hold small replication messages for an
    // ack and add latency the benchmark does not ask for.
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    direction(a.try_clone()?, b.try_clone()?, delay)?;
    direction(b, a, delay)?;
    Ok(())
}

/// Forwards `from` to `to`, each chunk `delay` late.
fn direction(from: TcpStream, to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (tx, rx) = sync_channel(QUEUE_CHUNKS);
    let source = from.try_clone()?;
    std::thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || read_side(from, tx, delay))?;
    std::thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || write_side(to, source, rx))?;
    Ok(())
}

fn read_side(mut from: TcpStream, tx: SyncSender<Chunk>, delay: Duration) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        let chunk = Chunk {
            due: Instant::now() + delay,
            data: (n > 0).then(|| buf[..n].to_vec()),
        };
        let end = chunk.data.is_none();
        // A send fails only when the writer is gone (its peer closed):
        // nothing more can be delivered, so stop reading too.
        if tx.send(chunk).is_err() || end {
            let _ = from.shutdown(Shutdown::Read);
            return;
        }
    }
}

/// `source` is the stream this direction reads from, closed too when the
/// destination fails.
fn write_side(mut to: TcpStream, source: TcpStream, rx: Receiver<Chunk>) {
    while let Ok(chunk) = rx.recv() {
        let now = Instant::now();
        if chunk.due > now {
            std::thread::sleep(chunk.due - now);
        }
        match chunk.data {
            Some(data) => {
                if to.write_all(&data).is_err() {
                    break;
                }
            }
            // The other side finished sending: pass the FIN on, late like
            // the bytes before it, and let the reverse direction run out.
            None => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
        }
    }
    // The destination failed: close both sockets so both ends see the
    // break (a replication peer then redials) and every thread of this
    // connection ends, the blocked reader included.
    let _ = to.shutdown(Shutdown::Both);
    let _ = source.shutdown(Shutdown::Both);
}
