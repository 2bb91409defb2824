//! The configuration file: named providers of every kind, and what the
//! model-facing subagent tool offers, in one TOML file that every front
//! door of the `subagents` binary reads (feature `config`).
//!
//! ```toml
//! [models.fast]                   # a model route: see below
//! api = "openai-chat"
//! base_url = "http://127.0.0.1:8000/v1"
//! model = "local"
//! rpm = 300
//!
//! [providers.cheap]
//! kind = "spawn"
//! model = "scripted"              # or a route ("fast"), "openai:NAME", "openai-responses:NAME", "anthropic:NAME"
//!
//! [providers.codex]
//! kind = "acp"
//! command = "codex-acp"
//! env = { OPENAI_API_KEY = "${OPENAI_API_KEY}" }
//! permission = "allow"
//! reuse = "pooled"
//! pool = { size = 2 }
//!
//! [providers.flaky]
//! kind = "chaos"
//! wraps = "cheap"
//! seed = 7
//! faults = [{ stage = "run", fault = "error", probability = 0.2 }]
//!
//! [tool]
//! providers = ["cheap", "codex"]
//! ```
//!
//! Where it is found ([`Config::load`]): the path given (`--config`), else
//! `$SUBAGENTS_CONFIG`, else `./subagents.toml` when it exists, else the
//! built-in configuration ([`Config::builtin`]), which is what the binary
//! did before it read a file: `spawn`, `fork` and `mock`, with the tool on
//! `spawn`.
//!
//! What the file says is checked when it is read, before anything starts:
//! an unknown key or kind, a value of the wrong type, a key of another
//! table (named with where it belongs and the keys this table takes), a
//! `chaos` provider wrapping itself, a missing provider or another
//! wrapper, a duration without a unit, an MCP server a provider's
//! `mcp_servers` lists but no `[mcp_servers]` table defines (see the
//! guide's "MCP tools for children"). Each error is one [`ConfigError`]
//! that reads `FILE:LINE:COL: what is wrong`.
//!
//! What a provider needs from the environment (an ACP command on `PATH`,
//! a `${VAR}` that is set, a URL or a header an HTTP request can carry
//! once expanded, a `run_dir_root` or `home` where no file stands) is
//! resolved when the file is read too, but a fault stays with its
//! provider ([`ProviderEntry::problem`]): a command fails only for the
//! providers it uses ([`Config::check_used`], [`Config::register_used`]).
//! Each kind's keys, checks and build live in its own home (`kinds/`).
//!
//! A file is bounded before the work it would cost ([`MAX_FILE_BYTES`],
//! [`MAX_ENTRIES`], [`MAX_NAME_BYTES`], [`MAX_WRAPS_DEPTH`]): whatever
//! `--config` points at (a device, a FIFO, a generated file of a hundred
//! thousand tables), reading it takes bounded memory and time.
//!
//! Secrets never sit in the file: `${VAR}` in a string (an `env` value, an
//! argument, a command, a URL) is replaced by that environment variable
//! when the file is read, and an unset one is an error.
//!
//! ```
//! use subagents::config::Config;
//!
//! let config = Config::parse("[providers.cheap]\nkind = \"spawn\"\n", "example.toml").unwrap();
//! assert_eq!(config.provider_names().collect::<Vec<_>>(), ["cheap"]);
//! let error = Config::parse("[providers.cheap]\nkind = \"spwan\"\n", "example.toml").unwrap_err();
//! assert!(error.to_string().starts_with("example.toml:2:8: "), "{error}");
//! ```
//!
//! Model routes (`[models.NAME]`: `api`, `base_url`, `api_key_env`,
//! `model`, `max_tokens`, `timeout`, `retries`, `rpm`, `tpm`,
//! `max_concurrent`) become [`ModelRoute`]s when
//! the file is read; a spawn or fork provider's `model` names one, or
//! keeps the command line's forms (`scripted`, `openai:NAME`,
//! `openai-responses:NAME`, `anthropic:NAME`), and a name
//! that is neither is an error at its place. Each route has one limiter,
//! shared by every model built from it in the process
//! ([`Config::model_spec`]). An `api` whose adapter this build lacks is
//! refused at its place.
//!
//! Building ([`Config::register`]) turns each entry into its provider and
//! registers them in file order; the in-process kinds take their models
//! from the caller (so a front door can probe an endpoint once, up front).

mod bounds;
mod build;
mod door;
mod keys;
mod kinds;
mod mcp_servers;
mod permissions;
mod routes;
mod schema;
mod values;

use std::collections::HashSet;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;
use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

pub use bounds::{MAX_ENTRIES, MAX_FILE_BYTES, MAX_NAME_BYTES, MAX_WRAPS_DEPTH};
pub use build::{BuildContext, BuildError, ModelSource, RegisterOutcome};
pub use door::{Configured, OfferError};
pub use kinds::{Kind, KindCapabilities};
pub use routes::{ModelError, UnknownModel};
use schema::FileTable;

use crate::agent::{ModelRoute, ModelSpec};
use crate::seam::Rules;

/// The file's name in the working directory, read when present.
pub const DEFAULT_FILE: &str = "subagents.toml";

/// The environment variable naming the file when `--config` does not.
pub const CONFIG_ENV: &str = "SUBAGENTS_CONFIG";

/// The subagent tool's depth cap when `[tool]` sets none.
pub const DEFAULT_TOOL_MAX_DEPTH: u32 = crate::tool::DEFAULT_MAX_DEPTH;

/// What the binary does without a file.
const BUILTIN: &str = r#"
[providers.spawn]
kind = "spawn"

[providers.fork]
kind = "fork"

[providers.mock]
kind = "mock"
reply = "handled: "
echo_prompt = true
delay = "20ms"

[tool]
providers = ["spawn"]
"#;

/// A configuration, read and checked.
#[derive(Debug)]
pub struct Config {
    origin: Origin,
    routes: Vec<routes::RouteEntry>,
    providers: Vec<ProviderEntry>,
    tool_providers: Vec<String>,
    tool_max_depth: u32,
    /// `[approvals]`, read.
    approvals: Option<Rules>,
    /// `[mcp_servers.NAME]`, in file order.
    #[cfg_attr(not(feature = "mcp-client"), allow(dead_code))]
    mcp_servers: Vec<mcp_servers::McpServerEntry>,
}

/// Where a configuration came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Built in ([`Config::builtin`]).
    Builtin,
    /// Read from this file.
    File(PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Builtin => f.write_str("built-in"),
            Origin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// One `[providers.NAME]` entry.
#[derive(Debug)]
pub struct ProviderEntry {
    name: String,
    kind: Kind,
    line: usize,
    /// Its table, checked by its kind and resolved against the environment.
    checked: Box<dyn kinds::Checked>,
    /// Why it cannot be built in this environment (an unset `${VAR}`, a
    /// program not on `PATH`): kept with it, not with the file.
    problem: Option<ConfigError>,
    /// The MCP servers its children mount (`mcp_servers`), checked at load.
    mcp_servers: Vec<String>,
}

impl ProviderEntry {
    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The line of the file its table starts on (0 when built in).
    pub fn line(&self) -> usize {
        self.line
    }

    /// The MCP servers its children mount, by `[mcp_servers]` name.
    pub fn mcp_servers(&self) -> &[String] {
        &self.mcp_servers
    }

    /// Why this provider cannot be built here, with its place: what the
    /// environment lacks (an unset `${VAR}`, a program not on `PATH`, a
    /// directory that cannot be one). `None` when nothing is missing. Only
    /// a command that uses the provider fails for it
    /// ([`Config::check_used`]).
    pub fn problem(&self) -> Option<&ConfigError> {
        self.problem.as_ref()
    }
}

/// A configuration that cannot be used: where and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// `FILE:LINE:COL`, or just the file when the fault has no place in it.
    place: String,
    message: String,
}

impl ConfigError {
    /// What is wrong, without the place.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Turns byte spans of one file's text into `FILE:LINE:COL` places.
pub(crate) struct Source<'a> {
    name: &'a str,
    text: &'a str,
    /// The byte offset each line starts at (the first, 0, included).
    line_starts: Vec<usize>,
}

impl<'a> Source<'a> {
    fn new(name: &'a str, text: &'a str) -> Self {
        let after_newlines = text.match_indices('\n').map(|(at, _)| at + 1);
        Source { name, text, line_starts: std::iter::once(0).chain(after_newlines).collect() }
    }

    /// An error at `span` (its start), or at the file when there is none.
    pub(crate) fn error(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let place = match span {
            Some(span) => {
                let (line, column) = self.line_column(span.start);
                format!("{}:{line}:{column}", self.name)
            }
            None => self.name.to_owned(),
        };
        ConfigError { place, message: message.into() }
    }

    /// 1-based line of byte `offset`: a search of the line starts, so a
    /// file of many tables costs its length once, not once per table.
    fn line(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&start| start <= offset)
    }

    /// 1-based line and column (in characters) of byte `offset`.
    fn line_column(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line(offset);
        let line_start = self.line_starts[line - 1];
        (line, self.text.get(line_start..offset).map_or(0, |before| before.chars().count()) + 1)
    }
}

impl Config {
    /// The file `explicit` names, else `$SUBAGENTS_CONFIG`, else
    /// `./subagents.toml` when it exists; `None` means the built-in one.
    pub fn locate(explicit: Option<&Path>) -> Option<PathBuf> {
        if let Some(path) = explicit {
            return Some(path.to_path_buf());
        }
        if let Some(path) = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(path));
        }
        let local = Path::new(DEFAULT_FILE);
        local.is_file().then(|| local.to_path_buf())
    }

    /// Reads the file [`Config::locate`] finds, or the built-in one.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        match Config::locate(explicit) {
            Some(path) => Config::read(&path),
            None => Ok(Config::builtin()),
        }
    }

    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let text = bounds::read_file(path).map_err(|message| ConfigError { place: name.clone(), message })?;
        let mut config = Config::parse(&text, &name)?;
        config.origin = Origin::File(path.to_path_buf());
        Ok(config)
    }

    /// Parses and checks `text`; `name` is the file name errors carry.
    pub fn parse(text: &str, name: &str) -> Result<Config, ConfigError> {
        let source = Source::new(name, text);
        bounds::check_text(&source)?;
        let root = DeTable::parse(text).map_err(|error| source.error(error.span(), error.message().trim_end()))?;
        let root_span = root.span();
        let mut root = root.into_inner();
        let tables = schema::Tables::new();
        tables.check(&source, &root)?;
        let provider_tables = match root.remove("providers") {
            None => IndexMap::new(),
            Some(providers) => match providers.into_inner() {
                DeValue::Table(providers) => {
                    providers.into_iter().map(|(name, table)| (name.into_inner().into_owned(), table)).collect()
                }
                _ => return Err(source.error(Some(root_span), "`providers` holds tables: [providers.NAME]")),
            },
        };
        let approvals = root.remove("approvals").map(|table| permissions::approvals(&source, table)).transpose()?;
        let file = FileTable::deserialize(toml::de::Deserializer::from(Spanned::new(root_span.clone(), root)))
            .map_err(|error| keys::located(&source, root_span, &error))?;
        bounds::check_tables(&source, "providers", "provider", &provider_tables)?;
        bounds::check_tables(&source, "models", "route", &file.models)?;
        bounds::check_tables(&source, "mcp_servers", "MCP server", &file.mcp_servers)?;
        let routes = routes::resolve(&source, file.models)?;
        let mcp_servers = mcp_servers::resolve(&source, file.mcp_servers)?;
        let mut providers = Vec::with_capacity(provider_tables.len());
        for (name, table) in provider_tables {
            let span = table.span();
            if !table.get_ref().is_table() {
                return Err(source
                    .error(Some(span), format!("provider {} is a table: [providers.NAME]", bounds::quoted(&name))));
            }
            let (kind, kind_span) = kinds::kind_of(&source, table.get_ref().get("kind"), span.clone())?;
            let checking = kinds::Checking { source: &source, name: &name, kind_span, mcp_servers: &mcp_servers };
            let mut checked = kinds::check(&checking, kind, table, &tables.besides(kind))?;
            let mounts = mcp_servers::check_listed(&source, &name, checked.mcp_servers(), &mcp_servers)?;
            // A server it mounts that the environment cannot serve is its problem too.
            let mounted_problem = || {
                let mounted = mcp_servers.iter().filter(|server| mounts.contains(&server.name));
                mounted.filter_map(|server| server.problem.clone()).next()
            };
            let problem = checked.resolve(&checking).err().or_else(mounted_problem);
            let line = source.line(span.start);
            providers.push(ProviderEntry { name, kind, line, checked, problem, mcp_servers: mounts });
        }
        build::check_wrappers(&source, &providers)?;
        routes::check_models(&source, &mut providers, &routes)?;
        let (tool_providers, tool_max_depth) = match file.tool {
            Some(tool) => {
                let names = match tool.providers {
                    Some(names) => {
                        let defined: HashSet<&str> = providers.iter().map(|entry| entry.name.as_str()).collect();
                        let mut checked = Vec::new();
                        for name in names.into_inner() {
                            let message = if !defined.contains(name.get_ref().as_str()) {
                                format!(
                                    "[tool] offers {}, which no [providers] table defines",
                                    bounds::quoted(name.get_ref())
                                )
                            } else if checked.contains(name.get_ref()) {
                                format!("[tool] offers {:?} twice", name.get_ref())
                            } else {
                                checked.push(name.into_inner());
                                continue;
                            };
                            return Err(source.error(Some(name.span()), message));
                        }
                        checked
                    }
                    None => default_tool_providers(&providers),
                };
                (names, tool.max_depth.map_or(DEFAULT_TOOL_MAX_DEPTH, Spanned::into_inner))
            }
            None => (default_tool_providers(&providers), DEFAULT_TOOL_MAX_DEPTH),
        };
        Ok(Config {
            origin: Origin::Builtin,
            routes,
            providers,
            tool_providers,
            tool_max_depth,
            approvals,
            mcp_servers,
        })
    }

    /// The configuration the binary uses without a file: `spawn`, `fork`
    /// and `mock`, the tool on `spawn`.
    pub fn builtin() -> Config {
        let mut config = Config::parse(BUILTIN, "built-in").expect("the built-in configuration is valid");
        // Its entries have no place a person could open.
        config.providers.iter_mut().for_each(|entry| entry.line = 0);
        config
    }

    /// Where it came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Every provider entry, in file order.
    pub fn providers(&self) -> &[ProviderEntry] {
        &self.providers
    }

    /// The providers' names, in file order.
    pub fn provider_names(&self) -> impl Iterator<Item = &str> {
        self.providers.iter().map(|entry| entry.name.as_str())
    }

    /// The entry named `name`.
    pub fn provider(&self, name: &str) -> Option<&ProviderEntry> {
        self.providers.iter().find(|entry| entry.name == name)
    }

    /// What the model-facing subagent tool offers, by provider name: `[tool]
    /// providers`, else `spawn` when defined, else the first provider.
    pub fn tool_providers(&self) -> &[String] {
        &self.tool_providers
    }

    /// The tool's depth cap (`[tool] max_depth`, default 3).
    pub fn tool_max_depth(&self) -> u32 {
        self.tool_max_depth
    }

    /// `[approvals]`: what a door with a policy (`fanout`) answers a
    /// child's permission request; `Policy::Ask` parks it. `None` without
    /// the table.
    pub fn approvals(&self) -> Option<&Rules> {
        self.approvals.as_ref()
    }

    /// Every model route (`[models.NAME]`), in file order, served or not
    /// by this environment ([`Config::route_problem`]).
    pub fn routes(&self) -> impl ExactSizeIterator<Item = &Arc<ModelRoute>> {
        self.routes.iter().map(|entry| &entry.route)
    }

    /// The route named `name`.
    pub fn route(&self, name: &str) -> Option<&Arc<ModelRoute>> {
        self.routes().find(|route| route.name == name)
    }

    /// What this environment lacks to serve the route named `name` (its
    /// key's variable unset), if anything: only a command that uses the
    /// route fails for it.
    pub fn route_problem(&self, name: &str) -> Option<&ConfigError> {
        self.routes.iter().find(|entry| entry.route.name == name).and_then(|entry| entry.problem.as_ref())
    }

    /// The model `spec` names: a route of this file (sharing its limiter),
    /// else one of [`ModelSpec::parse`]'s forms; `Err` says which names
    /// exist, or why this environment cannot serve the route.
    ///
    /// ```
    /// use subagents::agent::ModelSpec;
    /// use subagents::config::Config;
    ///
    /// let text = "[models.fast]\napi = \"openai-chat\"\nmodel = \"m\"\nrpm = 60\n";
    /// let config = Config::parse(text, "example.toml").unwrap();
    /// let ModelSpec::Route(route) = config.model_spec("fast").unwrap() else { panic!() };
    /// assert_eq!(route.limiter(), config.route("fast").unwrap().limiter());
    /// assert_eq!(config.model_spec("scripted").unwrap(), ModelSpec::Scripted);
    /// assert!(config.model_spec("slow").unwrap_err().to_string().contains("(fast)"));
    /// ```
    pub fn model_spec(&self, spec: &str) -> Result<ModelSpec, ModelError> {
        routes::spec(&self.routes, spec)
    }

    /// The distinct models the in-process providers name (`None`: the
    /// caller's default), so a front door can build and probe each once.
    pub fn models(&self) -> Vec<Option<String>> {
        let mut models = Vec::new();
        for entry in self.providers.iter().filter(|entry| entry.checked.in_process()) {
            {
                let model = entry.checked.in_process_model().map(|m| m.get_ref().clone());
                if !models.contains(&model) {
                    models.push(model);
                }
            }
        }
        models
    }
}

/// Without `[tool] providers`: `spawn` when defined, else the first.
fn default_tool_providers(providers: &[ProviderEntry]) -> Vec<String> {
    let pick = providers.iter().find(|entry| entry.name == "spawn").or(providers.first());
    pick.map(|entry| vec![entry.name.clone()]).unwrap_or_default()
}

/// `500ms`, `1.5s`, `10m`, `1h`: a number (a fraction too) and its unit,
/// to the millisecond.
///
/// ```
/// use std::time::Duration;
/// use subagents::config::parse_duration;
///
/// assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
/// assert!(parse_duration("5").unwrap_err().to_string().contains("needs a unit"));
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let not_a_duration = || DurationError::NotADuration(text.to_owned());
    let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !digits(fraction) {
        return Err(not_a_duration());
    }
    let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| not_a_duration())? };
    let millis: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(DurationError::NoUnit(text.to_owned())),
    };
    // The fraction's digits past the millisecond are dropped.
    let mut fraction_millis = 0u64;
    let mut scale = millis;
    for digit in fraction.bytes().map(|b| u64::from(b - b'0')) {
        if scale < 10 {
            break;
        }
        scale /= 10;
        fraction_millis += digit * scale;
    }
    Ok(Duration::from_millis(whole.saturating_mul(millis).saturating_add(fraction_millis)))
}

/// [`parse_duration`], and more than zero.
pub fn parse_positive_duration(text: &str) -> Result<Duration, DurationError> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(DurationError::Zero(text.to_owned()));
    }
    Ok(duration)
}

/// Why a text is not the duration [`parse_duration`] or
/// [`parse_positive_duration`] was asked for; each holds the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a number followed by a unit.
    #[error("{0:?} is not a duration such as 30s or 1.5s")]
    NotADuration(String),
    /// A number without one of the units.
    #[error("{0:?} needs a unit: ms, s, m or h")]
    NoUnit(String),
    /// Zero where some time is needed.
    #[error("{0:?} is no time at all: give at least 1ms")]
    Zero(String),
}
