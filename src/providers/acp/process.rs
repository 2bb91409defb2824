//! One ACP agent process: spawned, `initialize`d, and serving any number of
//! sessions, each routed to the run that opened it.
//!
//! Both reuse modes are built on it: `per_run` starts one for a run and
//! climbs the dispose ladder at the run's dispose; `pooled`
//! ([`super::pool`]) hands it to one run after another. The connection task
//! serves the agent's notifications and permission requests and routes each
//! `session/update` by its session id, so a pooled process's sessions never
//! see each other's text or progress. A prompt is awaited on its own task:
//! a run's dispose can then tell whether the agent has answered it (a
//! pooled process must not go back to the pool with a prompt still
//! running), and the process counts its unanswered prompts, which decide
//! how long its dispose ladder waits after EOF ([`super::dispose`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock as AcpBlock, McpServer, NewSessionRequest, PromptRequest,
    RequestPermissionRequest, RequestPermissionResponse, SessionId, SessionNotification, SystemPrompt,
};
use agent_client_protocol::{v1, Client};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::dispose::{Activity, Graces};
use super::run_dir::RunDir;
use super::Connection;
use super::{choose, initialize, note_update, transport, AcpConfig, DelegatedText};
use crate::child_process::Spawned;
use crate::child_process::HANDSHAKE_TIMEOUT;
use crate::live::ProcessLease;
use crate::seam::{Category, Failure, ProviderContext, StopReason};
use crate::wire::acp::stop_reason_of;

/// Where one session's updates go: its run's answer text and progress.
pub(super) struct Route {
    pub text: Arc<Mutex<String>>,
    pub progress: ProviderContext,
    /// What each delegating tool call showed last.
    pub delegated: DelegatedText,
}

type Routes = Arc<Mutex<HashMap<SessionId, Route>>>;

/// How the agent answered one `session/prompt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// It answered with a stop reason.
    Stopped(StopReason),
    /// It answered with an error, or the connection failed first.
    Failed(Category),
}

impl Answer {
    /// Whether the process may serve another session after this answer:
    /// an error answer is the agent's own, a dead or babbling peer is not.
    pub(super) fn leaves_process_sound(self) -> bool {
        !matches!(self, Answer::Failed(Category::ChildCrashed | Category::Protocol | Category::TimedOut))
    }
}

/// A spawned and initialized ACP agent.
pub(super) struct AgentProcess {
    cx: Connection,
    routes: Routes,
    /// Set when the agent broke the protocol (a line that is not JSON, or
    /// one past the cap).
    broken: Arc<AtomicBool>,
    /// Tripped when the connection ended (the agent closed its stdout or
    /// died).
    ended: CancellationToken,
    /// Its unanswered prompts and last line, for the dispose ladder.
    activity: Arc<Activity>,
    close: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    spawned: Mutex<Option<Spawned>>,
    /// Its private directory, removed once it is reaped.
    run_dir: Mutex<Option<RunDir>>,
    /// The process id (also its process group id).
    pub pid: u32,
}

impl std::fmt::Debug for AgentProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentProcess").field("pid", &self.pid).field("healthy", &self.healthy()).finish()
    }
}

impl AgentProcess {
    /// Spawns `config`'s command in `cwd` and runs `initialize`. `Err(None)`
    /// when `cancel` tripped first; on any error the process is already
    /// killed and reaped.
    pub(super) async fn start(
        config: &AcpConfig,
        cwd: &Path,
        lease: ProcessLease,
        cancel: &CancellationToken,
    ) -> Result<AgentProcess, Option<Category>> {
        let (mut spawned, run_dir) = config.spawn_agent(cwd, lease).await.map_err(|error| {
            tracing::warn!(provider = %config.name, %error, "could not spawn an ACP child");
            Some(Category::StartupFailed)
        })?;
        let (routes, broken, ended) = (Routes::default(), Arc::new(AtomicBool::new(false)), CancellationToken::new());
        let activity = Arc::new(Activity::default());
        let (ready, connected) = oneshot::channel::<Connection>();
        let (close, closed) = oneshot::channel::<()>();
        let seen = Seen { routes: routes.clone(), broken: broken.clone(), activity: activity.clone() };
        let serve = connection(&mut spawned, config, seen, ready, closed, ended.clone());
        let task = tokio::spawn(serve);
        let handshake = async {
            let cx = connected.await.map_err(|_| Category::ChildCrashed)?;
            cx.send_request(initialize()).block_task().await.map_err(|e| category_of(&e))?;
            Ok::<_, Category>(cx)
        };
        let outcome = tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(None),
            outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => match outcome {
                Ok(Ok(ready)) => Ok(ready),
                Ok(Err(category)) => Err(Some(category)),
                Err(_) => Err(Some(Category::TimedOut)),
            },
        };
        match outcome {
            Ok(cx) => Ok(AgentProcess {
                cx,
                routes,
                broken,
                ended,
                activity,
                close: Mutex::new(Some(close)),
                task: Mutex::new(Some(task)),
                pid: spawned.pid,
                spawned: Mutex::new(Some(spawned)),
                run_dir: Mutex::new(run_dir),
            }),
            Err(category) => {
                // Reap before rejecting: nothing outlives a failed start.
                task.abort();
                spawned.kill().await;
                if let Some(run_dir) = run_dir {
                    run_dir.remove().await;
                }
                Err(category)
            }
        }
    }

    /// Whether the process can take another session: alive, connected, and
    /// never caught breaking the protocol.
    pub(super) fn healthy(&self) -> bool {
        if self.broken.load(Ordering::Acquire) || self.ended.is_cancelled() {
            return false;
        }
        let mut spawned = lock(&self.spawned);
        spawned.as_mut().is_some_and(|spawned| matches!(spawned.child.try_wait(), Ok(None)))
    }

    /// `session/new` in `cwd`; the session's updates go to `route` from
    /// then on.
    pub(super) async fn open_session(
        &self,
        cwd: PathBuf,
        system_prompt: Option<SystemPrompt>,
        mcp_servers: Vec<McpServer>,
        route: Route,
    ) -> Result<SessionId, Category> {
        let mut request = NewSessionRequest::new(cwd).mcp_servers(mcp_servers);
        if let Some(system_prompt) = system_prompt {
            request = request.system_prompt(system_prompt);
        }
        let answered = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.cx.send_request(request).block_task()).await;
        let session_id = match answered {
            Ok(Ok(answer)) => answer.session_id,
            Ok(Err(error)) => return Err(category_of(&error)),
            Err(_) => return Err(Category::TimedOut),
        };
        lock(&self.routes).insert(session_id.clone(), route);
        Ok(session_id)
    }

    /// Sends `text` as the session's prompt; the receiver holds the answer
    /// once the agent gives it (awaited on its own task, so a run's
    /// dispose can see whether it came).
    pub(super) fn prompt(&self, session_id: &SessionId, text: String) -> watch::Receiver<Option<Answer>> {
        self.activity.prompt_sent();
        let mut request = PromptRequest::new(session_id.clone(), vec![AcpBlock::from(text)]);
        // Inside the run's span: the agent's turn joins its trace.
        request.meta = crate::telemetry::current_trace().map(crate::seam::TraceContext::into_meta);
        let sent = self.cx.send_request(request);
        let (broken, activity) = (self.broken.clone(), self.activity.clone());
        let (answer, answered) = watch::channel(None);
        tokio::spawn(async move {
            let answered = sent.block_task().await;
            let outcome = match answered {
                Ok(response) => Answer::Stopped(stop_reason_of(response.stop_reason)),
                Err(_) if broken.load(Ordering::Acquire) => Answer::Failed(Category::Protocol),
                Err(error) => Answer::Failed(category_of(&error)),
            };
            // Only the agent's own answer ends its prompt: a connection that
            // closed first (a dispose mid-prompt) leaves it still working.
            if matches!(outcome, Answer::Stopped(_) | Answer::Failed(Category::ChildError)) {
                activity.prompt_answered();
            }
            let _ = answer.send(Some(outcome));
        });
        answered
    }

    /// `session/cancel` for the session's running prompt.
    pub(super) fn cancel(&self, session_id: &SessionId) {
        let _ = self.cx.send_notification(CancelNotification::new(session_id.clone()));
    }

    /// Stops routing the session's updates (late ones are dropped).
    pub(super) fn forget(&self, session_id: &SessionId) {
        lock(&self.routes).remove(session_id);
    }

    /// Kills the process group at once and reaps it (a failed start).
    pub(super) async fn kill(&self) {
        self.end_connection();
        let spawned = lock(&self.spawned).take();
        if let Some(spawned) = spawned {
            spawned.kill().await;
        }
        self.remove_run_dir().await;
    }

    /// The dispose ladder: look for the agent's descendants, close the
    /// connection (stdin EOF), wait for the EOF phase
    /// ([`Activity::eof_phase`]), SIGTERM the group and the descendants,
    /// wait `graces.term`, SIGKILL.
    pub(super) async fn dispose(&self, graces: Graces) -> Result<(), Failure> {
        let spawned = lock(&self.spawned).take();
        let disposed = match spawned {
            // The ladder looks for the agent's descendants before the
            // connection ends: an agent exiting at EOF would orphan them.
            Some(spawned) => spawned.dispose(self.close_input(), || self.activity.eof_phase(graces), graces.term).await,
            None => {
                self.close_input().await;
                Ok(())
            }
        };
        self.remove_run_dir().await;
        disposed
    }

    /// Ends the connection, which closes its writer on the way out: stdin EOF.
    async fn close_input(&self) {
        let task = self.end_connection();
        if let Some(mut task) = task {
            if tokio::time::timeout(Duration::from_secs(1), &mut task).await.is_err() {
                task.abort(); // dropping the connection closes the child's stdin
            }
        }
    }

    /// Removes the private directory once the process is gone.
    async fn remove_run_dir(&self) {
        let run_dir = lock(&self.run_dir).take();
        if let Some(run_dir) = run_dir {
            run_dir.remove().await;
        }
    }

    fn end_connection(&self) -> Option<tokio::task::JoinHandle<()>> {
        if let Some(close) = lock(&self.close).take() {
            let _ = close.send(());
        }
        lock(&self.task).take()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn category_of(error: &agent_client_protocol::Error) -> Category {
    if agent_client_protocol::is_incoming_transport_closed(error)
        || agent_client_protocol::is_connection_terminated(error)
    {
        Category::ChildCrashed
    } else {
        Category::ChildError
    }
}

/// What the connection task records of the agent: its sessions' updates
/// (by route), a broken protocol, its activity.
struct Seen {
    routes: Routes,
    broken: Arc<AtomicBool>,
    activity: Arc<Activity>,
}

/// The connection task: hands out the connection, then serves the agent's
/// notifications (routed by session) and permission requests until
/// `closed` fires or the agent goes away; trips `ended` on the way out.
fn connection(
    spawned: &mut Spawned,
    config: &AcpConfig,
    seen: Seen,
    ready: oneshot::Sender<Connection>,
    closed: oneshot::Receiver<()>,
    ended: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let Seen { routes, broken, activity } = seen;
    let transport = transport(spawned, broken, activity);
    let permission = config.permission;
    async move {
        let _ended = ended.drop_guard();
        let ran = Client
            .v1()
            .name("subagents")
            .on_receive_notification(
                async move |notification: SessionNotification, _cx: Connection| {
                    let routes = lock(&routes);
                    if let Some(route) = routes.get(&notification.session_id) {
                        note_update(route, notification.update);
                    }
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                async move |request: RequestPermissionRequest,
                            responder: v1::Responder<RequestPermissionResponse>,
                            _cx: Connection| {
                    responder.respond(RequestPermissionResponse::new(choose(permission, &request)))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(transport, async |cx: Connection| {
                let _ = ready.send(cx.clone());
                // Serve until the process is disposed (or the peer goes away).
                tokio::select! {
                    _ = closed => {}
                    _ = cx.incoming_closed() => {}
                }
                Ok(())
            })
            .await;
        if let Err(error) = ran {
            tracing::debug!(code = error.code.value(), "an ACP connection ended with an error");
        }
    }
}
