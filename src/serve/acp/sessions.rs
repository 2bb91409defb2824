//! The sessions `subagents acp` holds, and what each keeps while it lives:
//! its agent, the MCP servers its client handed it, and the cancel token of
//! its latest prompt.
//!
//! A long-lived agent serves sessions without end, so nothing here outlives
//! what it belongs to: a prompt's token is given back when its turn ends, a
//! session's agent and servers when the client closes it (`session/close`),
//! and at most `max_live` sessions are held at once. Past that a
//! new session takes the place of the least recently used one that runs no
//! turn (its history stays in the session store; prompting it after answers
//! "unknown session"); when every one runs a turn, the new one is refused.
//!
//! ```text
//! session/new   -> insert (may give back the least recently used idle one)
//! session/prompt-> begin_turn ... end_turn (the turn's token given back)
//! session/cancel-> cancel (the latest prompt's token and the agent's turn)
//! session/close -> close (cancelled, then shut down beside the loop)
//! ```

use std::collections::HashMap;

use agent_client_protocol::v1::schema::SessionId;
use tokio_util::sync::CancellationToken;

use super::MountedServer;
use crate::agent::Agent;

/// How many sessions `subagents acp` holds at once unless told otherwise
/// (`--max-sessions`).
pub const DEFAULT_MAX_SESSIONS: usize = 1024;

/// Every live session, by id.
pub(super) struct Sessions {
    live: HashMap<SessionId, Live>,
    max_live: usize,
    /// Counts uses (a new session, a prompt): the least recently used
    /// session has the smallest stamp.
    clock: u64,
}

/// One session while it lives.
struct Live {
    agent: Agent,
    servers: Vec<MountedServer>,
    last_used: u64,
    /// Turns running or queued.
    turns: usize,
    /// The latest prompt's turn and its token, tripped by `session/cancel`:
    /// a cancel handled before the turn's task first ran still stops it.
    latest_turn: Option<(u64, CancellationToken)>,
}

/// A session taken out of [`Sessions`]: shut it down ([`Closed::shut_down`]).
pub(super) struct Closed {
    agent: Agent,
    servers: Vec<MountedServer>,
}

impl Closed {
    /// Cancels its turns, waits for them, and closes its MCP servers.
    pub(super) async fn shut_down(self) {
        let _ = self.agent.shutdown().await;
        shut_down_servers(self.servers).await;
    }
}

/// Closes MCP servers a session mounted.
pub(super) async fn shut_down_servers(servers: Vec<MountedServer>) {
    #[cfg(feature = "mcp-client")]
    futures_util::future::join_all(servers.iter().map(crate::agent::McpServer::shutdown)).await;
    drop(servers);
}

/// A turn begun on a session: its number (for [`Sessions::end_turn`]), its
/// agent and the token `session/cancel` trips.
pub(super) struct Turn {
    pub(super) number: u64,
    pub(super) agent: Agent,
    pub(super) cancelled: CancellationToken,
}

/// Why a session could not be held.
#[derive(Debug)]
pub(super) struct Full {
    pub(super) max_live: usize,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "at most {} sessions at once, and every one is running a turn: close one (session/close) or wait",
            self.max_live
        )
    }
}

impl Sessions {
    /// No sessions yet; at most `max_live` (at least one) at once.
    pub(super) fn new(max_live: usize) -> Sessions {
        Sessions { live: HashMap::new(), max_live: max_live.max(1), clock: 0 }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Holds a new session, giving back the least recently used idle one
    /// when `max_live` are held (shut it down); `Err` when every
    /// one runs a turn (then `agent` and `servers` come back, to be shut down).
    pub(super) fn insert(
        &mut self,
        id: SessionId,
        agent: Agent,
        servers: Vec<MountedServer>,
    ) -> Result<Option<Closed>, (Full, Closed)> {
        let mut evicted = None;
        if self.live.len() >= self.max_live {
            let idle = self.live.iter().filter(|(_, live)| live.turns == 0).min_by_key(|(_, live)| live.last_used);
            match idle.map(|(id, _)| id.clone()) {
                Some(oldest) => {
                    tracing::info!(session = %oldest, max_live = self.max_live, "closing the least recently used session to hold a new one");
                    evicted = self.close(&oldest);
                }
                None => return Err((Full { max_live: self.max_live }, Closed { agent, servers })),
            }
        }
        let last_used = self.tick();
        self.live.insert(id, Live { agent, servers, last_used, turns: 0, latest_turn: None });
        Ok(evicted)
    }

    /// Begins a turn on session `id` (`None`: no such session).
    pub(super) fn begin_turn(&mut self, id: &SessionId) -> Option<Turn> {
        let number = self.tick();
        let live = self.live.get_mut(id)?;
        live.last_used = number;
        live.turns += 1;
        let cancelled = CancellationToken::new();
        live.latest_turn = Some((number, cancelled.clone()));
        Some(Turn { number, agent: live.agent.clone(), cancelled })
    }

    /// Turn `number` of session `id` ended: its token is given back.
    pub(super) fn end_turn(&mut self, id: &SessionId, number: u64) {
        let Some(live) = self.live.get_mut(id) else { return };
        live.turns = live.turns.saturating_sub(1);
        if live.latest_turn.as_ref().is_some_and(|(latest, _)| *latest == number) {
            live.latest_turn = None;
        }
    }

    /// Cancels session `id`'s turns: its latest prompt's (even before that
    /// turn first ran) and the one running.
    pub(super) fn cancel(&self, id: &SessionId) {
        if let Some(live) = self.live.get(id) {
            if let Some((_, cancelled)) = &live.latest_turn {
                cancelled.cancel();
            }
            live.agent.cancel();
        }
    }

    /// Takes session `id` out, its turns cancelled (`None`: no such session).
    pub(super) fn close(&mut self, id: &SessionId) -> Option<Closed> {
        self.cancel(id);
        let Live { agent, servers, .. } = self.live.remove(id)?;
        Some(Closed { agent, servers })
    }

    /// Takes every session out (at exit).
    pub(super) fn drain(&mut self) -> Vec<Closed> {
        self.live.drain().map(|(_, Live { agent, servers, .. })| Closed { agent, servers }).collect()
    }
}
