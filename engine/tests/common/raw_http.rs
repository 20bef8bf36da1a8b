//! HTTP/1.1 written and read by hand on a raw socket: for what a client
//! library would not send or would hide (a request held half-sent, an
//! answer's exact headers, a connection the server closes).

/// One HTTP/1.1 query sent over a raw socket, with `bearer` as its
/// credentials: the socket, left open, so a test can hang up mid-query
/// (drop it) or read the answer.
pub fn send_query(
    addr: std::net::SocketAddr,
    sql: &str,
    bearer: Option<&str>,
) -> std::net::TcpStream {
    use std::io::Write;
    let body = serde_json::json!({ "sql": sql }).to_string();
    let auth = bearer.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/databases/main/query HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    s
}

/// One HTTP/1.1 answer read off a raw socket: its head, then exactly its
/// `content-length` of body (the connection may stay open after it).
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// A header's value, lower-cased (None: absent).
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_ascii_lowercase())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Reads one answer from `stream` (see [`RawAnswer`]); panics if the
/// connection closes before a whole one.
pub fn read_answer(stream: &mut std::net::TcpStream) -> RawAnswer {
    use std::io::Read;
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("receive");
        assert_eq!(n, 1, "the connection closed before an answer: {raw:?}");
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    let mut answer = RawAnswer {
        status,
        head,
        body: Vec::new(),
    };
    let length: usize = answer
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a content-length: {}", answer.head));
    answer.body = vec![0u8; length];
    stream.read_exact(&mut answer.body).expect("the body");
    answer
}

/// Whether the peer closes `stream` within `within` (reads until EOF;
/// false if it is still open then, or sends something).
pub fn closed_within(stream: &mut std::net::TcpStream, within: std::time::Duration) -> bool {
    use std::io::Read;
    stream.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 256];
    match stream.read(&mut buf) {
        Ok(n) => n == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}
