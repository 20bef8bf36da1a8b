//! The portable transport: blocking sockets, one reader thread per
//! connection, writes on the caller's thread (no hop between a commit and
//! its send). A write that cannot finish within [`WRITE_TIMEOUT`] closes
//! the connection, so a stalled peer cannot stall its sender for long.

use super::{ConnId, NetHandler, Transport};
use crate::wire::{FRAME_HEADER_BYTES, MAX_FRAME_BYTES, Message, encode_append};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const READ_CHUNK: usize = 256 * 1024;

struct Shared {
    handler: Arc<dyn NetHandler>,
    next: AtomicU64,
    conns: Mutex<HashMap<ConnId, Arc<Mutex<TcpStream>>>>,
}

/// See the module docs.
pub struct StdTransport {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StdTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdTransport")
            .field("connections", &self.shared.conns.lock().len())
            .finish()
    }
}

impl StdTransport {
    pub fn new(handler: Arc<dyn NetHandler>) -> StdTransport {
        StdTransport {
            shared: Arc::new(Shared {
                handler,
                next: AtomicU64::new(1),
                conns: Mutex::new(HashMap::new()),
            }),
        }
    }
}

impl Shared {
    /// Registers a connected stream and starts its reader; returns its id.
    fn register(self: &Arc<Self>, stream: TcpStream) -> io::Result<ConnId> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let conn = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().insert(conn, Arc::new(Mutex::new(stream)));
        Ok(conn)
    }

    fn start_reader(self: &Arc<Self>, conn: ConnId) {
        let Some(stream) = self.conns.lock().get(&conn).cloned() else {
            return;
        };
        let reader = match stream.lock().try_clone() {
            Ok(r) => r,
            Err(e) => {
                self.drop_conn(conn, Some(e.to_string()));
                return;
            }
        };
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("walrelay-net-{conn}"))
            .spawn(move || {
                let error = shared.read_loop(conn, reader).err().map(|e| e.to_string());
                shared.drop_conn(conn, error);
            });
        if let Err(e) = spawned {
            self.drop_conn(conn, Some(e.to_string()));
        }
    }

    fn read_loop(&self, conn: ConnId, mut stream: TcpStream) -> io::Result<()> {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let mut scratch = vec![0u8; READ_CHUNK];
        loop {
            // Hand over every complete frame already buffered.
            let mut handed = false;
            loop {
                if buf.len() < FRAME_HEADER_BYTES {
                    break;
                }
                let len = u64::from(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]])) + 4;
                if len > MAX_FRAME_BYTES {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("frame of {len} bytes exceeds the limit"),
                    ));
                }
                if (buf.len() as u64) < len {
                    // Grow only as bytes arrive: a header alone must not make
                    // this side allocate the size it claims.
                    break;
                }
                let frame: Bytes = buf.split_to(len as usize).freeze();
                let (message, _) = Message::decode(&frame)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                self.handler.message(conn, message);
                handed = true;
            }
            if handed {
                self.handler.drained(conn);
            }
            // One small copy per read keeps this free of unsafe; page
            // images are sliced out of `buf` without further copies.
            let n = match stream.read(&mut scratch) {
                Ok(0) => return Ok(()), // orderly close
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            buf.extend_from_slice(&scratch[..n]);
        }
    }

    fn drop_conn(&self, conn: ConnId, error: Option<String>) {
        let removed = self.conns.lock().remove(&conn);
        if let Some(s) = removed {
            let _ = s.lock().shutdown(Shutdown::Both);
            self.handler.closed(conn, error);
        }
    }
}

impl Transport for StdTransport {
    fn listen(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr)?;
        let bound = listener.local_addr()?;
        let shared = Arc::clone(&self.shared);
        std::thread::Builder::new()
            .name("walrelay-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let from = stream
                        .peer_addr()
                        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                    if let Ok(conn) = shared.register(stream) {
                        // Announce before reading, so the handler knows the
                        // connection before its first message.
                        shared.handler.accepted(conn, from);
                        shared.start_reader(conn);
                    }
                }
            })?;
        Ok(bound)
    }

    fn connect(&self, addr: SocketAddr, tag: u64) {
        let shared = Arc::clone(&self.shared);
        let spawned = super::dial_in_background(addr, CONNECT_TIMEOUT, move |stream| match stream
            .and_then(|s| shared.register(s))
        {
            Ok(conn) => {
                shared.handler.connected(conn, tag);
                shared.start_reader(conn);
            }
            Err(e) => shared.handler.connect_failed(tag, e),
        });
        if let Err(e) = spawned {
            self.shared.handler.connect_failed(tag, e);
        }
    }

    fn send(&self, conn: ConnId, message: &Message) {
        let Some(stream) = self.shared.conns.lock().get(&conn).cloned() else {
            return;
        };
        let result = match message {
            Message::Append(record) => {
                let (head, body) = encode_append(&record.bytes);
                write_all_vectored(&mut stream.lock(), &[&head, &body])
            }
            other => match other.encode() {
                Ok(frame) => stream.lock().write_all(&frame),
                Err(e) => Err(io::Error::new(io::ErrorKind::InvalidInput, e.to_string())),
            },
        };
        if result.is_err() {
            // The reader thread sees the shutdown and reports `closed`: never
            // call the handler from here, the caller may hold its locks.
            let _ = stream.lock().shutdown(Shutdown::Both);
        }
    }

    fn close(&self, conn: ConnId) {
        let stream = self.shared.conns.lock().get(&conn).cloned();
        if let Some(s) = stream {
            let _ = s.lock().shutdown(Shutdown::Both);
        }
    }

    fn backend(&self) -> &'static str {
        "std"
    }
}

/// Writes every byte of `parts`, in order, with as few syscalls as the
/// kernel allows.
fn write_all_vectored(stream: &mut TcpStream, parts: &[&[u8]]) -> io::Result<()> {
    let mut index = 0;
    let mut offset = 0;
    while index < parts.len() {
        let slices: Vec<IoSlice<'_>> = std::iter::once(&parts[index][offset..])
            .chain(parts[index + 1..].iter().copied())
            .map(IoSlice::new)
            .collect();
        let mut n = match stream.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while index < parts.len() && n >= parts[index].len() - offset {
            n -= parts[index].len() - offset;
            index += 1;
            offset = 0;
        }
        offset += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::{Bookmark, Epoch, Sequence};
    use crate::record::Record;
    use std::sync::mpsc;

    struct Collect(Mutex<mpsc::Sender<(ConnId, Option<Message>)>>);
    impl NetHandler for Collect {
        fn accepted(&self, _: ConnId, _: SocketAddr) {}
        fn connected(&self, conn: ConnId, _: u64) {
            let _ = self.0.lock().send((conn, None));
        }
        fn connect_failed(&self, _: u64, e: io::Error) {
            panic!("connect failed: {e}");
        }
        fn message(&self, conn: ConnId, message: Message) {
            let _ = self.0.lock().send((conn, Some(message)));
        }
        fn closed(&self, _: ConnId, _: Option<String>) {}
    }

    #[test]
    fn messages_cross_a_connection_in_order_with_appends_intact() {
        let (tx, rx) = mpsc::channel();
        let server = StdTransport::new(Arc::new(Collect(Mutex::new(tx.clone()))));
        let addr = server
            .listen("127.0.0.1:0".parse().expect("addr"))
            .expect("listen");
        let client = StdTransport::new(Arc::new(Collect(Mutex::new(tx))));
        client.connect(addr, 7);
        let (conn, first) = rx.recv().expect("connected");
        assert!(first.is_none());
        let b = |s| Bookmark::new(Epoch(1), Sequence(s));
        let mut sent = Vec::new();
        for s in 1..=200u64 {
            let record = Record {
                bookmark: b(s),
                previous: b(s - 1),
                page_size: 4096,
                db_pages: 3,
                pages: vec![(2, Bytes::from(vec![s as u8; 4096]))],
            };
            let m = Message::Append(record.to_encoded().expect("encode"));
            client.send(conn, &m);
            client.send(conn, &Message::Ack { durable: b(s) });
            sent.push(m);
            sent.push(Message::Ack { durable: b(s) });
        }
        for want in sent {
            let (_, got) = rx.recv().expect("message");
            assert_eq!(got, Some(want));
        }
    }
}
