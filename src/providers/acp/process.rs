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
use super::{initialize, note_update, transport, AcpConfig, DelegatedText};
use crate::child_process::{account, redacted, Spawned, StderrTail, HANDSHAKE_TIMEOUT};
use crate::live::ProcessLease;
use crate::seam::Answer as Decision;
use crate::seam::{Category, Failure, ProviderContext, StopReason};
use crate::wire::acp::{outcome_of, stop_reason_of};

/// Where one session's updates go: its run's answer text and progress.
pub(super) struct Route {
    pub text: Arc<Mutex<String>>,
    pub progress: ProviderContext,
    /// What each delegating tool call showed last.
    pub delegated: DelegatedText,
    /// The session's transcript in the parent's home.
    pub transcript: Arc<super::transcript::Transcript>,
    /// Its run's answers to permission requests.
    pub asking: Arc<super::Asking>,
}

type Routes = Arc<Mutex<HashMap<SessionId, Route>>>;

/// How the agent answered one `session/prompt`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// It answered with a stop reason.
    Stopped(StopReason),
    /// It answered with an error, or the connection failed first.
    Failed(Fault),
}

impl Answer {
    /// Whether the process may serve another session after this answer:
    /// an error answer is the agent's own, a dead or babbling peer is not.
    pub(super) fn leaves_process_sound(&self) -> bool {
        !matches!(self, Answer::Failed(fault) if matches!(fault.category, Category::ChildCrashed | Category::Protocol | Category::TimedOut))
    }
}

/// Why a start, a session or a prompt failed: a category, and the agent's
/// own account when there is one (its error answer, its exit, its stderr).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fault {
    pub category: Category,
    /// The agent's words: its error answer, later the whole account.
    pub said: Option<String>,
}

impl From<Category> for Fault {
    fn from(category: Category) -> Self {
        Fault { category, said: None }
    }
}

impl Fault {
    /// What the connection's error says: a transport gone is a crash (the
    /// account comes from the process), an error answer is the agent's.
    fn of(error: &agent_client_protocol::Error) -> Fault {
        let category = category_of(error);
        let said = (category == Category::ChildError).then(|| words_of(error));
        Fault { category, said }
    }

    /// The fault with the agent's whole account: its words, how it exited
    /// (a crash waits a moment for that, and for the rest of its stderr),
    /// the tail of its stderr; the values of the environment `config` set
    /// for it replaced. The whole text is logged at debug.
    fn accounted(self, config: &AcpConfig, exit: Option<String>, stderr: String) -> Fault {
        let text = redacted(&account(self.said.as_deref(), exit, &stderr), &config.env);
        tracing::debug!(provider = %config.name, category = ?self.category, account = %text, "an ACP agent failed");
        Fault { category: self.category, said: (!text.is_empty()).then_some(text) }
    }
}

/// Why a probe's `initialize` failed, with the agent's account (its error
/// answer, or how it exited and the tail of its stderr), made one safe,
/// bounded line: the probe's error is shown as it is.
pub(super) async fn probe_account(
    config: &AcpConfig,
    spawned: &mut Spawned,
    error: &agent_client_protocol::Error,
) -> super::ProbeFailure {
    let fault = Fault::of(error);
    let (exit, stderr) = exit_and_stderr(spawned).await;
    let said = fault.said.clone().unwrap_or_else(|| error.message.clone());
    let fault = Fault { said: Some(said), ..fault }.accounted(config, exit, stderr);
    let shown = crate::seam::Diagnostic::new(&config.name, crate::seam::Stage::Initialize, fault.category)
        .with_detail(fault.said.unwrap_or_default())
        .detail
        .unwrap_or_default();
    super::ProbeFailure::Initialize(shown)
}

/// How an agent that failed its handshake exited (waited for a moment:
/// one that died may still be exiting, and the wrong program may live on)
/// and the last of its stderr (the rest waited for, once it exited).
async fn exit_and_stderr(spawned: &mut Spawned) -> (Option<String>, String) {
    let exit = spawned.exit_within(ACCOUNT_WAIT).await;
    let stderr = match exit {
        Some(_) => spawned.stderr.settled(ACCOUNT_WAIT).await,
        None => spawned.stderr.last_lines(),
    };
    (exit, stderr)
}

/// How long a failed agent's exit status and last stderr are waited for.
const ACCOUNT_WAIT: Duration = Duration::from_secs(1);

/// An error answer in words: `JSON-RPC error -32603: Internal error: <its
/// data>`.
fn words_of(error: &agent_client_protocol::Error) -> String {
    let mut words = format!("JSON-RPC error {}: {}", error.code.value(), error.message);
    match &error.data {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::String(data)) => {
            words.push_str(": ");
            words.push_str(crate::seam::cut(data, 4096));
        }
        Some(data) => {
            words.push_str(": ");
            words.push_str(crate::seam::cut(&data.to_string(), 4096));
        }
    }
    words
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
    /// The tail of its stderr (shared by a pooled process's sessions).
    stderr: StderrTail,
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
    ) -> Result<AgentProcess, Option<Fault>> {
        let (mut spawned, run_dir) = match config.spawn_agent(cwd, lease).await {
            Ok(spawned) => spawned,
            Err(error) => {
                tracing::warn!(provider = %config.name, %error, "could not spawn an ACP child");
                let said = format!("could not start {}: {error}", config.command.display());
                return Err(Some(Fault {
                    category: Category::StartupFailed,
                    said: Some(redacted(&said, &config.env)),
                }));
            }
        };
        let (routes, broken, ended) = (Routes::default(), Arc::new(AtomicBool::new(false)), CancellationToken::new());
        let activity = Arc::new(Activity::default());
        let (ready, connected) = oneshot::channel::<Connection>();
        let (close, closed) = oneshot::channel::<()>();
        let seen = Seen { routes: routes.clone(), broken: broken.clone(), activity: activity.clone() };
        let serve = connection(&mut spawned, seen, ready, closed, ended.clone());
        let task = tokio::spawn(serve);
        let handshake = async {
            let cx = connected.await.map_err(|_| Fault::from(Category::ChildCrashed))?;
            cx.send_request(initialize()).block_task().await.map_err(|e| Fault::of(&e))?;
            Ok::<_, Fault>(cx)
        };
        let outcome = tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(None),
            outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => match outcome {
                Ok(Ok(ready)) => Ok(ready),
                Ok(Err(fault)) => Err(Some(fault)),
                Err(_) => Err(Some(Fault::from(Category::TimedOut))),
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
                stderr: spawned.stderr.clone(),
                spawned: Mutex::new(Some(spawned)),
                run_dir: Mutex::new(run_dir),
            }),
            Err(fault) => {
                let fault = match fault {
                    Some(fault) => {
                        let (exit, stderr) = exit_and_stderr(&mut spawned).await;
                        Some(fault.accounted(config, exit, stderr))
                    }
                    None => None,
                };
                // Reap before rejecting: nothing outlives a failed start.
                task.abort();
                spawned.kill().await;
                if let Some(run_dir) = run_dir {
                    run_dir.remove().await;
                }
                Err(fault)
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
    ) -> Result<SessionId, Fault> {
        let mut request = NewSessionRequest::new(cwd).mcp_servers(mcp_servers);
        if let Some(system_prompt) = system_prompt {
            request = request.system_prompt(system_prompt);
        }
        let answered = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.cx.send_request(request).block_task()).await;
        let session_id = match answered {
            Ok(Ok(answer)) => answer.session_id,
            Ok(Err(error)) => return Err(Fault::of(&error)),
            Err(_) => return Err(Fault::from(Category::TimedOut)),
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
                Err(_) if broken.load(Ordering::Acquire) => Answer::Failed(Fault::from(Category::Protocol)),
                Err(error) => Answer::Failed(Fault::of(&error)),
            };
            // Only the agent's own answer ends its prompt: a connection that
            // closed first (a dispose mid-prompt) leaves it still working.
            let own = |answer: &Answer| match answer {
                Answer::Stopped(_) => true,
                Answer::Failed(fault) => fault.category == Category::ChildError,
            };
            if own(&outcome) {
                activity.prompt_answered();
            }
            let _ = answer.send(Some(outcome));
        });
        answered
    }

    /// `fault` (a session's or a prompt's) with the agent's whole account:
    /// after a crash its exit and the rest of its stderr are waited for
    /// (at most a second each), else the stderr so far is taken.
    pub(super) async fn account(&self, config: &AcpConfig, fault: Fault) -> Fault {
        if fault.category != Category::ChildCrashed {
            return fault.accounted(config, None, self.stderr.last_lines());
        }
        let deadline = tokio::time::Instant::now() + ACCOUNT_WAIT;
        let exit = loop {
            let status = lock(&self.spawned).as_mut().and_then(|spawned| spawned.child.try_wait().ok().flatten());
            if let Some(status) = status {
                break Some(crate::child_process::exit_words(status));
            }
            if tokio::time::Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let stderr = self.stderr.settled(ACCOUNT_WAIT).await;
        fault.accounted(config, exit, stderr)
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
    seen: Seen,
    ready: oneshot::Sender<Connection>,
    closed: oneshot::Receiver<()>,
    ended: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let Seen { routes, broken, activity } = seen;
    let asked = routes.clone();
    let transport = transport(spawned, broken, activity);
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
                            cx: Connection| {
                    let run = lock(&asked)
                        .get(&request.session_id)
                        .map(|route| (route.asking.clone(), route.transcript.clone()));
                    // The answer may wait on a person: beside the dispatch
                    // loop, which must go on serving the session.
                    cx.spawn(async move {
                        let (ours, answer) = match &run {
                            Some((asking, _)) => {
                                let ours = asking.request_of(&request);
                                let answer = asking.decide(ours.clone()).await;
                                (ours, answer)
                            }
                            None => (
                                crate::wire::acp::permission_request_of(&request, None),
                                Decision::reject("no run has this session"),
                            ),
                        };
                        let outcome = outcome_of(&ours, &answer);
                        if let Some((_, transcript)) = &run {
                            transcript.permission(&request, &outcome, &answer);
                        }
                        responder.respond(RequestPermissionResponse::new(outcome))
                    })
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
