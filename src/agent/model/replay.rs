//! Recorded tapes: record the answers of any model, replay them later.
//!
//! A [`Tape`] holds, per calling session, the answers that session received,
//! in order. Sessions are numbered in the order of their first call, which
//! is what lets nested runs replay: a parent's first call comes before the
//! child it delegates to, so a live parent binds to the recorded parent and a
//! live child to the recorded child, although their ids are new. When a
//! recorded session's first prompt equals the live one's, that match
//! wins over first-call order, so concurrent children whose calls interleave
//! differently still find their own answers.
//!
//! ```
//! use subagents::agent::{RecordingModel, ReplayModel, ScriptedModel};
//!
//! let recorder = RecordingModel::new(ScriptedModel::new());
//! // … run agents on `recorder`, then:
//! let tape = recorder.tape();
//! let replay = ReplayModel::new(tape);
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{Model, ModelError, ModelReply, ModelRequest};

/// Recorded answers, grouped by calling session in first-call order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tape {
    /// One entry per calling session.
    pub sessions: Vec<TapeSession>,
}

/// What one session was answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TapeSession {
    /// The prompt the session's first call answered (its latest user
    /// message then), used to bind it on replay.
    pub first_prompt: Option<String>,
    /// The answers, in call order.
    pub answers: Vec<TapeAnswer>,
}

/// One recorded answer: a reply or a failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TapeAnswer {
    /// The model answered.
    Reply(ModelReply),
    /// The call failed with this message.
    Error(String),
}

impl Tape {
    /// Reads a tape written by [`Tape::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Tape, ModelError> {
        let path = path.as_ref();
        let text = std::fs::read(path).map_err(|e| ModelError::Config(format!("cannot read tape: {e}")))?;
        serde_json::from_slice(&text).map_err(|e| ModelError::Config(format!("tape is not valid: {e}")))
    }

    /// Writes the tape as JSON.
    pub fn save(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)
    }

    fn save_atomically(&self, path: &Path) -> std::io::Result<()> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        self.save(&partial)?;
        std::fs::rename(&partial, path)
    }
}

/// Live session ids bound to tape entries.
#[derive(Default)]
struct Bindings {
    /// `(live session id, tape index, next answer)`.
    live: Vec<(String, usize, usize)>,
}

impl Bindings {
    fn slot(&mut self, session_id: &str) -> Option<&mut (String, usize, usize)> {
        self.live.iter_mut().find(|(id, _, _)| id == session_id)
    }
}

/// Wraps any model and records what it answers into a [`Tape`].
pub struct RecordingModel<M> {
    inner: M,
    state: Arc<Mutex<(Tape, Bindings)>>,
    file: Option<PathBuf>,
}

impl<M: Model> std::fmt::Debug for RecordingModel<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingModel")
            .field("inner", &self.inner.name())
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl<M: Model> RecordingModel<M> {
    /// Records `inner` in memory; read it with [`RecordingModel::tape`].
    pub fn new(inner: M) -> Self {
        RecordingModel { inner, state: Arc::default(), file: None }
    }

    /// Records `inner` and rewrites the tape file at `path` after every
    /// answer (write to a temporary file, then rename), so a crash loses at
    /// most the answer in flight.
    pub fn writing_to(inner: M, path: impl Into<PathBuf>) -> Self {
        RecordingModel { inner, state: Arc::default(), file: Some(path.into()) }
    }

    /// The tape so far.
    pub fn tape(&self) -> Tape {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0.clone()
    }
}

impl<M: Model> Model for RecordingModel<M> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn session_closed(&self, session_id: &str) {
        self.inner.session_closed(session_id);
    }

    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ModelReply, ModelError>> {
        let index = {
            let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let (tape, bindings) = &mut *guard;
            match bindings.slot(&request.session_id) {
                Some((_, index, _)) => *index,
                None => {
                    tape.sessions.push(TapeSession { first_prompt: request.last_user_text(), answers: Vec::new() });
                    let index = tape.sessions.len() - 1;
                    bindings.live.push((request.session_id.clone(), index, 0));
                    index
                }
            }
        };
        Box::pin(async move {
            let answer = self.inner.complete(request, cancel).await;
            let recorded = match &answer {
                Ok(reply) => Some(TapeAnswer::Reply(reply.clone())),
                Err(ModelError::Cancelled) => None,
                Err(error) => Some(TapeAnswer::Error(error.to_string())),
            };
            if let Some(recorded) = recorded {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                state.0.sessions[index].answers.push(recorded);
                if let Some(path) = &self.file {
                    if let Err(error) = state.0.save_atomically(path) {
                        tracing::warn!(%error, path = %path.display(), "could not write the tape");
                    }
                }
            }
            answer
        })
    }
}

/// Replays a [`Tape`].
pub struct ReplayModel {
    tape: Tape,
    bindings: Mutex<Bindings>,
}

impl std::fmt::Debug for ReplayModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayModel").finish_non_exhaustive()
    }
}

impl ReplayModel {
    /// Replays `tape`.
    pub fn new(tape: Tape) -> Self {
        ReplayModel { tape, bindings: Mutex::default() }
    }

    /// Replays the tape at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        Ok(Self::new(Tape::load(path)?))
    }

    fn next_answer(&self, request: &ModelRequest) -> Result<TapeAnswer, ModelError> {
        let mut bindings = self.bindings.lock().unwrap_or_else(|e| e.into_inner());
        if bindings.slot(&request.session_id).is_none() {
            let taken = |index: usize| bindings.live.iter().any(|(_, i, _)| *i == index);
            let first_prompt = request.last_user_text();
            let free = (0..self.tape.sessions.len()).filter(|&i| !taken(i));
            let by_prompt = free.clone().find(|&i| self.tape.sessions[i].first_prompt == first_prompt);
            let index = by_prompt.or_else(|| free.clone().next()).ok_or_else(|| {
                ModelError::Scripted(format!(
                    "the tape holds {} sessions and all are bound; session {:?} has none",
                    self.tape.sessions.len(),
                    request.session_id
                ))
            })?;
            bindings.live.push((request.session_id.clone(), index, 0));
        }
        let (_, index, next) = bindings.slot(&request.session_id).expect("bound above");
        let answer = self.tape.sessions[*index].answers.get(*next).cloned().ok_or_else(|| {
            ModelError::Scripted(format!("tape session #{index} has no answer #{} (the tape ran out)", *next + 1))
        })?;
        *next += 1;
        Ok(answer)
    }
}

impl Model for ReplayModel {
    fn name(&self) -> &str {
        "replay"
    }

    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ModelReply, ModelError>> {
        let answer = self.next_answer(&request);
        Box::pin(async move {
            if cancel.is_cancelled() {
                return Err(ModelError::Cancelled);
            }
            match answer? {
                TapeAnswer::Reply(reply) => {
                    if let (Some(sink), false) = (&request.chunks, reply.text.is_empty()) {
                        sink(&reply.text);
                    }
                    Ok(reply)
                }
                TapeAnswer::Error(message) => Err(ModelError::Scripted(message)),
            }
        })
    }
}
