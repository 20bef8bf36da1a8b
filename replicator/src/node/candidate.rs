//! A node that wants to lead: wins an epoch from W followers
//! ([`crate::election`]) and reads the adopted log from the follower that
//! holds it. The engine decides what to do with the records (rebuild or
//! roll its database forward); the [`super::leader::LeaderNode`] it starts
//! next reconnects to the same followers, which already promised it the
//! epoch.

use super::CATCH_UP_IDLE;
use crate::bookmark::{Bookmark, Epoch};
use crate::chain::ChainHash;
use crate::election::{Election, ElectionError, ElectionEvent, Won};
use crate::ids::{DatabaseId, NodeId};
use crate::leader::PeerId;
use crate::net::mux::Mux;
use crate::net::{self, Backend, ClusterKey, ConnId, NetHandler, Transport};
use crate::record::Encoded;
use crate::wire::Message;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How to run an election.
#[derive(Debug, Clone)]
pub struct CandidateConfig {
    pub database: DatabaseId,
    pub node: NodeId,
    /// The lowest epoch to claim (above anything this node used before).
    pub min_epoch: Epoch,
    pub followers: Vec<SocketAddr>,
    pub write_quorum: usize,
    pub backend: Backend,
    pub auth: Option<ClusterKey>,
    /// How long to wait for W promises.
    pub timeout_ms: u64,
    /// A multiplexer shared with the process's other replication (its
    /// channels then carry the election; `backend` and `auth` are the
    /// mux's). None: a transport of the candidate's own.
    pub mux: Option<Mux>,
}

/// Why an election or the read of the adopted log failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CandidateError {
    #[error("only {promises} of the {needed} promises needed arrived within {waited_ms} ms")]
    Timeout {
        promises: usize,
        needed: usize,
        waited_ms: u64,
    },
    #[error(transparent)]
    Election(#[from] ElectionError),
    #[error("transport: {0}")]
    Io(String),
    #[error("the adopted follower went away while its log was read")]
    SourceLost,
    #[error("the adopted follower was silent for {0:?}")]
    SourceSilent(Duration),
    #[error("record {got} does not chain onto {after} in the adopted log")]
    Discontinuous { after: Bookmark, got: Bookmark },
    #[error("the adopted log ended at {got}, before {want}")]
    Short { got: Bookmark, want: Bookmark },
    #[error("applying a fetched record: {0}")]
    Apply(String),
    /// The adopted follower's log starts at `start`, after the position
    /// asked for: the records in between are in cold storage only (fetch
    /// them there, then ask again from `start`).
    #[error(
        "the adopted follower's log starts at {start} ({chain}): the records before it are in cold storage"
    )]
    Archived { start: Bookmark, chain: ChainHash },
}

#[derive(Default)]
struct Inbox {
    records: VecDeque<Encoded>,
    done: Option<Bookmark>,
    lost: bool,
    archived: Option<(Bookmark, ChainHash)>,
}

struct Core {
    election: Election,
    conns: HashMap<ConnId, usize>,
    /// The adopted follower's connection, once reading from it.
    source: Option<ConnId>,
    inbox: Inbox,
    failed_dials: Vec<usize>,
}

struct State {
    core: Mutex<Core>,
    changed: Condvar,
    transport: OnceLock<Arc<dyn Transport>>,
}

/// An election in progress or won.
pub struct Candidate {
    state: Arc<State>,
    config: CandidateConfig,
    won: Won,
    source: ConnId,
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("epoch", &self.won.epoch)
            .field("adopted", &self.won.adopted.end)
            .finish()
    }
}

impl Candidate {
    /// Claims an epoch from the followers until W promised one, or the
    /// timeout passes.
    pub fn elect(config: CandidateConfig) -> Result<Candidate, CandidateError> {
        let state = Arc::new(State {
            core: Mutex::new(Core {
                election: Election::new(
                    config.database,
                    config.node,
                    config.min_epoch,
                    config.write_quorum,
                ),
                conns: HashMap::new(),
                source: None,
                inbox: Inbox::default(),
                failed_dials: Vec::new(),
            }),
            changed: Condvar::new(),
            transport: OnceLock::new(),
        });
        let transport = match &config.mux {
            Some(mux) => mux.endpoint(Arc::clone(&state) as Arc<dyn NetHandler>),
            None => net::open(
                config.backend,
                Arc::clone(&state) as Arc<dyn NetHandler>,
                config.auth.clone(),
            )
            .map_err(|e| CandidateError::Io(e.to_string()))?,
        };
        let _ = state.transport.set(Arc::clone(&transport));
        let muxed = config.mux.is_some();
        let result = Self::run(state, transport.clone(), config);
        if result.is_err() && muxed {
            // A mux endpoint lives until shut down (the mux holds its
            // handler): a lost election must not leave it behind.
            transport.shutdown();
        }
        result
    }

    fn run(
        state: Arc<State>,
        transport: Arc<dyn net::Transport>,
        config: CandidateConfig,
    ) -> Result<Candidate, CandidateError> {
        for (i, addr) in config.followers.iter().enumerate() {
            transport.connect(*addr, i as u64);
        }
        let started = Instant::now();
        let deadline = started + Duration::from_millis(config.timeout_ms);
        let mut core = state.core.lock();
        loop {
            if let Some(e) = core.election.failed() {
                return Err(e.into());
            }
            if let Some(won) = core.election.won() {
                let source = core
                    .conns
                    .iter()
                    .find(|(_, i)| **i == won.adopted.index)
                    .map(|(c, _)| *c)
                    .ok_or(CandidateError::SourceLost)?;
                core.source = Some(source);
                drop(core);
                tracing::info!(
                    epoch = won.epoch.0,
                    adopted = %won.adopted.end.last,
                    from_follower = won.adopted.index,
                    confirmed = %won.confirmed,
                    "election won"
                );
                return Ok(Candidate {
                    state,
                    config,
                    won,
                    source,
                });
            }
            let redial: Vec<usize> = std::mem::take(&mut core.failed_dials);
            if !redial.is_empty() {
                drop(core);
                std::thread::sleep(Duration::from_millis(100));
                for i in redial {
                    transport.connect(config.followers[i], i as u64);
                }
                core = state.core.lock();
                continue;
            }
            if Instant::now() >= deadline {
                let promises = core.election.promise_count();
                for c in core.conns.keys() {
                    transport.close(*c);
                }
                return Err(CandidateError::Timeout {
                    promises,
                    needed: config.write_quorum,
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
            state
                .changed
                .wait_for(&mut core, Duration::from_millis(100));
        }
    }

    pub fn won(&self) -> &Won {
        &self.won
    }

    /// Reads the adopted log's records after `after` up to `upto` from the
    /// follower that holds it, in order, handing each to `each`; checks
    /// that they chain from `after` (whose chain is `after_chain`, if
    /// known).
    pub fn fetch(
        &self,
        after: Bookmark,
        after_chain: Option<ChainHash>,
        upto: Bookmark,
        each: &mut dyn FnMut(Encoded) -> Result<(), String>,
    ) -> Result<(), CandidateError> {
        let transport = self.state.transport.get().expect("set at elect");
        let (mut last, mut chain) = (after, after_chain);
        let mut asked = after;
        transport.send(self.source, &Message::CatchUp { from: after });
        while last < upto {
            let mut core = self.state.core.lock();
            let waited = Instant::now();
            while core.inbox.records.is_empty()
                && core.inbox.done.is_none()
                && core.inbox.archived.is_none()
                && !core.inbox.lost
            {
                if self
                    .state
                    .changed
                    .wait_for(&mut core, CATCH_UP_IDLE)
                    .timed_out()
                    && waited.elapsed() >= CATCH_UP_IDLE
                {
                    return Err(CandidateError::SourceSilent(CATCH_UP_IDLE));
                }
            }
            let records: Vec<Encoded> = core.inbox.records.drain(..).collect();
            let done = core.inbox.done.take();
            let lost = core.inbox.lost;
            if let Some((start, chain)) = core.inbox.archived.take() {
                return Err(CandidateError::Archived { start, chain });
            }
            drop(core);
            for r in records {
                if r.bookmark <= last {
                    continue;
                }
                if r.bookmark > upto {
                    break;
                }
                if r.previous != last || chain.is_some_and(|c| c != r.prev_chain) {
                    return Err(CandidateError::Discontinuous {
                        after: last,
                        got: r.bookmark,
                    });
                }
                (last, chain) = (r.bookmark, Some(r.chain));
                each(r).map_err(CandidateError::Apply)?;
            }
            if last >= upto {
                break;
            }
            if lost {
                return Err(CandidateError::SourceLost);
            }
            if let Some(d) = done {
                if d <= asked {
                    return Err(CandidateError::Short {
                        got: last,
                        want: upto,
                    });
                }
                asked = last;
                transport.send(self.source, &Message::CatchUp { from: last });
            }
        }
        Ok(())
    }

    /// The epoch won.
    pub fn epoch(&self) -> Epoch {
        self.won.epoch
    }

    pub fn config(&self) -> &CandidateConfig {
        &self.config
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let conns: Vec<ConnId> = self.state.core.lock().conns.keys().copied().collect();
        if let Some(t) = self.state.transport.get() {
            for c in conns {
                t.close(c);
            }
            if self.config.mux.is_some() {
                // Its channels only: the shared connections stay.
                t.shutdown();
            }
        }
    }
}

impl State {
    fn send_all(&self, sends: Vec<crate::election::Send>) {
        if let Some(t) = self.transport.get() {
            for s in sends {
                t.send(s.peer.0, &s.message);
            }
        }
    }
}

impl NetHandler for State {
    fn accepted(&self, conn: ConnId, _from: SocketAddr) {
        if let Some(t) = self.transport.get() {
            t.close(conn);
        }
    }

    fn connected(&self, conn: ConnId, tag: u64) {
        let mut core = self.core.lock();
        core.conns.insert(conn, tag as usize);
        let sends = core.election.handle(ElectionEvent::Connected {
            peer: PeerId(conn),
            index: tag as usize,
        });
        self.send_all(sends);
        self.changed.notify_all();
    }

    fn connect_failed(&self, tag: u64, _error: io::Error) {
        self.core.lock().failed_dials.push(tag as usize);
        self.changed.notify_all();
    }

    fn message(&self, conn: ConnId, message: Message) {
        let mut core = self.core.lock();
        if core.source == Some(conn) {
            match message {
                Message::Append(r) => core.inbox.records.push_back(r),
                Message::CatchUpDone { upto } => core.inbox.done = Some(upto),
                Message::Archived { start, chain, .. } => {
                    core.inbox.archived = Some((start, chain));
                }
                _ => {}
            }
        } else {
            let sends = core.election.handle(ElectionEvent::Received {
                peer: PeerId(conn),
                message,
            });
            self.send_all(sends);
        }
        self.changed.notify_all();
    }

    fn closed(&self, conn: ConnId, _error: Option<String>) {
        let mut core = self.core.lock();
        if let Some(index) = core.conns.remove(&conn) {
            if core.source == Some(conn) {
                core.inbox.lost = true;
            } else if core.source.is_none() {
                core.failed_dials.push(index);
            }
        }
        core.election
            .handle(ElectionEvent::Disconnected { peer: PeerId(conn) });
        self.changed.notify_all();
    }
}
