//! Forwarding a replica's writes to whichever node is the primary now.
//!
//! A replica knows a list of nodes that may be the primary (`--primary-http
//! a,b,c`). It sends to the one that answered last. If a node cannot be
//! reached (the connection was refused or never made: the request
//! certainly did not run) or answers 421 (it is not the primary), the next
//! one is tried, and the list is walked again after a pause until
//! `failover_wait_ms` has passed: during a failover a write waits for the
//! new primary instead of failing. Once a request may have reached a
//! primary (it was sent, and no answer came) it is never resent: the
//! outcome is unknown and the client is told so.
//!
//! A forwarded request carries [`FORWARDED_HEADER`]; a replica that gets
//! one it would have to forward again answers 421 instead, so requests
//! never loop between replicas.

use super::client::{self, RawAnswer, Request};
use super::server::{Answer, codes};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Marks a request a replica forwarded.
pub const FORWARDED_HEADER: &str = "x-walrelay-forwarded";

/// The answer of a node that is not the primary to a forwarded request.
pub const NOT_PRIMARY_STATUS: u16 = 421;

/// Where a replica's writes go.
#[derive(Debug)]
pub struct Primaries {
    urls: Vec<String>,
    current: AtomicUsize,
    failover_wait: Duration,
}

/// Why a forward found no primary to answer.
#[derive(Debug)]
pub enum ForwardError {
    /// No node answered as the primary within the wait (nothing ran).
    NoPrimary { tried: usize, waited_ms: u64 },
    /// The request was sent to `url` and no answer came: it may have run.
    Unknown { url: String, error: String },
}

/// Whether a request that failed with `e` certainly never reached a
/// server (so sending it elsewhere cannot run it twice).
pub(crate) fn never_sent(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => true,
        ureq::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::NotConnected
                | std::io::ErrorKind::AddrNotAvailable
        ),
        _ => false,
    }
}

impl Primaries {
    /// `list`: base URLs, comma-separated, in order of preference.
    pub fn new(list: &str, failover_wait_ms: u64) -> Primaries {
        Primaries {
            urls: list
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_string)
                .collect(),
            current: AtomicUsize::new(0),
            failover_wait: Duration::from_millis(failover_wait_ms),
        }
    }

    /// The node tried first now.
    pub fn current(&self) -> Option<&str> {
        let n = self.urls.len();
        (n > 0).then(|| self.urls[self.current.load(Ordering::Relaxed) % n].as_str())
    }

    /// Sends `request` to the primary, failing over as the module docs say.
    pub(crate) fn post(
        &self,
        agent: &ureq::Agent,
        request: &Request<'_>,
        max_answer_bytes: u64,
    ) -> Result<RawAnswer, ForwardError> {
        let n = self.urls.len();
        let started = Instant::now();
        let mut tried = 0usize;
        loop {
            for k in 0..n {
                let i = (self.current.load(Ordering::Relaxed) + k) % n;
                let url = &self.urls[i];
                tried += 1;
                match client::post_query(agent, url, request, max_answer_bytes) {
                    Ok(raw) if raw.status == NOT_PRIMARY_STATUS => continue,
                    Ok(raw) => {
                        if i != self.current.swap(i, Ordering::Relaxed) % n.max(1) {
                            tracing::info!(primary = %url, "writes now forwarded to a new primary");
                        }
                        return Ok(raw);
                    }
                    Err(e) if never_sent(&e) => continue,
                    Err(e) => {
                        return Err(ForwardError::Unknown {
                            url: url.clone(),
                            error: e.to_string(),
                        });
                    }
                }
            }
            if started.elapsed() >= self.failover_wait {
                return Err(ForwardError::NoPrimary {
                    tried,
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What a client gets for a forward: the primary's answer as it came, or a
/// 503 that says whether the request may have run.
pub(crate) fn answer(result: Result<RawAnswer, ForwardError>) -> Answer {
    match result {
        Ok(raw) => Answer::relayed(raw),
        Err(ForwardError::NoPrimary { tried, waited_ms }) => Answer::error(
            503,
            codes::UNAVAILABLE,
            format!(
                "no primary answered ({tried} attempts in {waited_ms} ms); the request did not run"
            ),
        )
        .retry_after(1),
        // Whether the primary ran the request is unknown once it was sent:
        // say so, so a client does not blindly retry a write.
        Err(ForwardError::Unknown { url, error }) => Answer::error(
            503,
            codes::UNAVAILABLE,
            format!(
                "no answer from the primary at {url} ({error}); a forwarded write may or may not have committed"
            ),
        ),
    }
}

/// A replica's answer to a forwarded request it would have to forward.
pub(crate) fn not_primary() -> Answer {
    Answer::error(
        NOT_PRIMARY_STATUS,
        codes::UNAVAILABLE,
        "this node is not the primary",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_its_order_and_drops_blanks() {
        let p = Primaries::new("http://a:1, ,http://b:2,", 0);
        assert_eq!(p.urls, vec!["http://a:1", "http://b:2"]);
        assert_eq!(p.current(), Some("http://a:1"));
        assert_eq!(Primaries::new("", 0).current(), None);
    }

    #[test]
    fn with_nobody_listening_nothing_is_sent_and_the_wait_is_bounded() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let p = Primaries::new(&format!("http://127.0.0.1:{port}"), 300);
        let agent = client::agent(Duration::from_secs(1));
        let started = Instant::now();
        let r = p.post(
            &agent,
            &Request {
                database: "main",
                bookmark: None,
                authorization: None,
                payload: b"{}",
                forwarded: true,
                path: None,
            },
            1 << 20,
        );
        assert!(
            matches!(r, Err(ForwardError::NoPrimary { .. })),
            "{:?}",
            r.as_ref().err()
        );
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
