//! The file's shape, as serde reads it: a table per model route, and one
//! flat table per provider whose keys every kind shares a namespace for, so
//! each value keeps its place in the file (a [`Spanned`]) and a key that
//! does not apply to the provider's kind is reported where it stands (see
//! [`Kind::accepts`]).

use indexmap::IndexMap;
use serde::Deserialize;
use toml::Spanned;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTable {
    #[serde(default)]
    pub(super) providers: IndexMap<String, Spanned<ProviderTable>>,
    #[serde(default)]
    pub(super) models: IndexMap<String, Spanned<RouteTable>>,
    pub(super) tool: Option<ToolTable>,
    #[serde(default)]
    pub(super) mcp_servers: IndexMap<String, Spanned<super::mcp_servers::McpServerTable>>,
}

/// `[models.NAME]`: a model route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteTable {
    pub(super) api: Spanned<ApiName>,
    pub(super) base_url: Option<Spanned<String>>,
    pub(super) api_key_env: Option<Spanned<String>>,
    pub(super) model: Spanned<String>,
    pub(super) max_tokens: Option<Spanned<u32>>,
    pub(super) timeout: Option<Spanned<String>>,
    pub(super) retries: Option<Spanned<u32>>,
    pub(super) rpm: Option<Spanned<u32>>,
    pub(super) tpm: Option<Spanned<u64>>,
    pub(super) max_concurrent: Option<Spanned<u32>>,
}

/// A route's `api`.
#[derive(Clone, Copy, Debug, Deserialize)]
pub(super) enum ApiName {
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    #[serde(rename = "anthropic")]
    Anthropic,
}

/// `[tool]`: what the model-facing subagent tool offers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ToolTable {
    pub(super) providers: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) max_depth: Option<Spanned<u32>>,
}

/// A provider's kind: the value of its `kind` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A fresh in-process child.
    Spawn,
    /// An in-process child seeded with the parent's completed turns.
    Fork,
    /// Scripted replies, for tests.
    Mock,
    /// A child process over the Agent Client Protocol.
    Acp,
    /// A fresh `subagents serve` runtime per run.
    Process,
    /// Runs on `subagents worker` processes through NATS JetStream.
    Remote,
    /// A task on a remote Agent2Agent agent.
    A2a,
    /// Seeded faults around another provider.
    Chaos,
}

impl Kind {
    /// The kind's name as the file spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Spawn => "spawn",
            Kind::Fork => "fork",
            Kind::Mock => "mock",
            Kind::Acp => "acp",
            Kind::Process => "process",
            Kind::Remote => "remote",
            Kind::A2a => "a2a",
            Kind::Chaos => "chaos",
        }
    }

    /// Whether a provider of this kind takes `key`.
    pub(super) fn accepts(self, key: &str) -> bool {
        const IN_PROCESS: &[&str] = &[
            "model",
            "tools",
            "max_depth",
            "max_steps",
            "structured_nudge_retries",
            "max_tokens",
            "persona",
            "budget",
            "mcp_servers",
        ];
        const CHILD_PROCESS: &[&str] = &["env", "inherit_env", "cwd", "dispose_eof_grace", "dispose_grace"];
        let own: &[&str] = match self {
            Kind::Spawn | Kind::Fork => IN_PROCESS,
            Kind::Mock => &["reply", "echo_prompt", "delay", "stop_reason"],
            Kind::Acp => &[
                "command",
                "args",
                "mcp_servers",
                "permission",
                "reuse",
                "pool",
                "dispose_idle_eof_grace",
                "template_dir",
                "keep_run_dirs",
                "run_dir_root",
            ],
            Kind::Process => {
                &["bin", "profile", "patches", "home", "model", "max_tokens", "shutdown_timeout", "mcp_servers"]
            }
            Kind::Remote => &[
                "nats",
                "pool",
                "connect_timeout",
                "publish_timeout",
                "dispose_wait",
                "broker_patience",
                "worker_patience",
                "detached_ttl",
            ],
            Kind::A2a => {
                &["url", "headers", "skill", "connect_timeout", "card_timeout", "first_event_timeout", "idle_timeout"]
            }
            Kind::Chaos => &["wraps", "seed", "faults"],
        };
        key == "kind"
            || own.contains(&key)
            || (matches!(self, Kind::Acp | Kind::Process) && CHILD_PROCESS.contains(&key))
    }
}

/// One `[providers.NAME]` table: every key any kind takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProviderTable {
    pub(super) kind: Spanned<Kind>,
    // spawn, fork (and process's route)
    pub(super) model: Option<Spanned<String>>,
    pub(super) tools: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) max_depth: Option<Spanned<u32>>,
    pub(super) max_steps: Option<Spanned<u32>>,
    pub(super) structured_nudge_retries: Option<Spanned<u32>>,
    pub(super) max_tokens: Option<Spanned<u32>>,
    pub(super) persona: Option<Spanned<String>>,
    pub(super) budget: Option<Spanned<BudgetTable>>,
    pub(super) mcp_servers: Option<Spanned<Vec<Spanned<String>>>>,
    // mock
    pub(super) reply: Option<Spanned<String>>,
    pub(super) echo_prompt: Option<Spanned<bool>>,
    pub(super) delay: Option<Spanned<String>>,
    pub(super) stop_reason: Option<Spanned<StopName>>,
    // acp
    pub(super) command: Option<Spanned<String>>,
    pub(super) args: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) permission: Option<Spanned<PermissionName>>,
    pub(super) reuse: Option<Spanned<ReuseName>>,
    pub(super) pool: Option<Spanned<PoolValue>>,
    pub(super) template_dir: Option<Spanned<String>>,
    pub(super) keep_run_dirs: Option<Spanned<bool>>,
    pub(super) run_dir_root: Option<Spanned<String>>,
    // acp and process
    pub(super) env: Option<Spanned<IndexMap<String, Spanned<String>>>>,
    pub(super) inherit_env: Option<Spanned<Vec<String>>>,
    pub(super) cwd: Option<Spanned<String>>,
    pub(super) dispose_eof_grace: Option<Spanned<String>>,
    pub(super) dispose_grace: Option<Spanned<String>>,
    pub(super) dispose_idle_eof_grace: Option<Spanned<String>>,
    // process
    pub(super) bin: Option<Spanned<String>>,
    pub(super) profile: Option<Spanned<String>>,
    pub(super) patches: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) home: Option<Spanned<String>>,
    pub(super) shutdown_timeout: Option<Spanned<String>>,
    // remote
    pub(super) nats: Option<Spanned<String>>,
    pub(super) connect_timeout: Option<Spanned<String>>,
    pub(super) publish_timeout: Option<Spanned<String>>,
    pub(super) dispose_wait: Option<Spanned<String>>,
    pub(super) broker_patience: Option<Spanned<String>>,
    pub(super) worker_patience: Option<Spanned<String>>,
    pub(super) detached_ttl: Option<Spanned<String>>,
    // a2a (and `connect_timeout`)
    pub(super) url: Option<Spanned<String>>,
    pub(super) headers: Option<Spanned<IndexMap<String, Spanned<String>>>>,
    pub(super) skill: Option<Spanned<String>>,
    pub(super) card_timeout: Option<Spanned<String>>,
    pub(super) first_event_timeout: Option<Spanned<String>>,
    pub(super) idle_timeout: Option<Spanned<String>>,
    // chaos
    pub(super) wraps: Option<Spanned<String>>,
    pub(super) seed: Option<Spanned<u64>>,
    pub(super) faults: Option<Spanned<Vec<Spanned<FaultTable>>>>,
}

/// `pool`: an ACP pool's settings, or a remote provider's worker pool.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum PoolValue {
    /// `pool = "gpu"` (remote).
    Name(String),
    /// `pool = { size = 2 }` (acp).
    Settings(PoolTable),
}

/// `pool = { … }` of a pooled acp provider (`reuse = "pooled"`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PoolTable {
    pub(super) size: Option<usize>,
    pub(super) sessions_per_process: Option<usize>,
    pub(super) max_runs_per_process: Option<usize>,
    pub(super) idle_timeout: Option<String>,
    pub(super) cancel_grace: Option<String>,
}

/// `budget = { … }` of an in-process provider: what each run may spend.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BudgetTable {
    pub(super) depth: Option<u32>,
    pub(super) width: Option<u32>,
    pub(super) runs: Option<u64>,
    pub(super) tokens: Option<u64>,
    pub(super) deadline: Option<String>,
}

/// One chaos rule: `{ stage = "run", fault = "error", probability = 0.2 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FaultTable {
    pub(super) stage: StageName,
    pub(super) fault: String,
    pub(super) probability: f64,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum StageName {
    Launch,
    Run,
    Dispose,
    Progress,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum PermissionName {
    Allow,
    Reject,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum ReuseName {
    PerRun,
    Pooled,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum StopName {
    Completed,
    Aborted,
    Error,
    MaxTokens,
    Refusal,
}

/// The keys a provider table set, with where each stands, for the check
/// that every key applies to its kind.
pub(super) fn keys_set(table: &ProviderTable) -> Vec<(&'static str, std::ops::Range<usize>)> {
    let mut keys = Vec::new();
    macro_rules! set {
        ($($field:ident),*) => {$(
            if let Some(value) = &table.$field {
                keys.push((stringify!($field), value.span()));
            }
        )*};
    }
    set!(
        model,
        tools,
        max_depth,
        max_steps,
        structured_nudge_retries,
        max_tokens,
        persona,
        budget,
        mcp_servers,
        reply,
        echo_prompt,
        delay,
        stop_reason,
        command,
        args,
        permission,
        reuse,
        pool,
        template_dir,
        keep_run_dirs,
        run_dir_root,
        env,
        inherit_env,
        cwd,
        dispose_eof_grace,
        dispose_grace,
        dispose_idle_eof_grace,
        bin,
        profile,
        patches,
        home,
        shutdown_timeout,
        nats,
        connect_timeout,
        publish_timeout,
        dispose_wait,
        broker_patience,
        worker_patience,
        detached_ttl,
        url,
        headers,
        skill,
        card_timeout,
        first_event_timeout,
        idle_timeout,
        wraps,
        seed,
        faults
    );
    keys
}
