//! `subagents providers list|check`: the providers a configuration defines.
//!
//! `list` reads the file only: each provider's name, kind, the start-time
//! capabilities its kind advertises (its provider's own constant), and
//! where it is defined; a provider the environment cannot serve (an unset
//! `${VAR}`, a program not on `PATH`) is listed with why, and `list` still
//! succeeds. `check
//! [NAME]` builds each provider (or NAME alone) as `run` and `fanout`
//! would, and more: an ACP agent answers `initialize`, a model endpoint is
//! probed, a NATS server is connected, a process child is started and
//! answers its `initialize` handshake. It lists what each advertises once
//! built, or why it could not be; exit 1 when one fails.

use std::process::ExitCode;

use serde_json::{json, Value};

use subagents::config::{BuildContext, Config, KindCapabilities, ProviderEntry};
use subagents::seam::Capabilities;

use crate::args::{ConfigArgs, HomeArgs, ModelArgs, RemoteArgs};
use crate::setup::{setup, Models};
use crate::terminal::{self, say};

/// `subagents providers`'s flags.
#[derive(clap::Args, Debug)]
pub struct ProvidersArgs {
    #[command(subcommand)]
    query: Query,
    #[command(flatten)]
    config: ConfigArgs,
    /// Print one JSON document instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand, Debug)]
enum Query {
    /// Name, kind, capabilities and where each provider is defined.
    List,
    /// Build every provider (probing agents, endpoints and brokers) and
    /// list what each one advertises; exit 1 when one fails.
    #[command(mut_arg("model", |model| model.help(CHILDREN_DEFAULT_MODEL)))]
    Check {
        /// Check only this provider (and what it wraps).
        name: Option<String>,
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        home: HomeArgs,
    },
}

/// `--model` said of the children the checked providers would start.
const CHILDREN_DEFAULT_MODEL: &str =
    "The children's default model: `scripted`, `openai:NAME`, `openai-responses:NAME`, `anthropic:NAME` or a route";

impl ProvidersArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        let config = self.config.load()?;
        match self.query {
            Query::List => {
                let rows: Vec<Row> = config.providers().iter().map(|entry| Row::listed(&config, entry)).collect();
                print(&rows, self.json);
                Ok(ExitCode::SUCCESS)
            }
            Query::Check { name, model, home } => check(&config, name.as_deref(), &model.model, home, self.json),
        }
    }
}

fn check(config: &Config, name: Option<&str>, model: &str, home: HomeArgs, json: bool) -> Result<ExitCode, String> {
    if let Some(name) = name.filter(|name| config.provider(name).is_none()) {
        let known: Vec<&str> = config.provider_names().collect();
        return Err(format!("unknown provider {name:?} (the configuration defines {})", known.join(", ")));
    }
    // The runtime and the default model first, with no provider yet.
    let none = Config::parse("", "no providers").expect("an empty file is valid");
    let setup = match setup(model, home.resolve(), "", &RemoteArgs::default(), &none) {
        Ok(setup) => setup,
        Err(error) => {
            say!("subagents: check failed: {error}");
            return Ok(ExitCode::from(1));
        }
    };
    let outcomes = Models::new(model, config, &setup.runtime).and_then(|models| {
        let source = |spec: Option<&str>| models.get(spec);
        let context = BuildContext {
            subagents: &setup.subagents,
            tasks: &setup.tasks,
            home: &setup.home,
            models: &source,
            probe: true,
        };
        config.register_each_blocking(&context, name).map_err(|e| e.to_string())
    });
    let outcomes = match outcomes {
        Ok(outcomes) => outcomes,
        Err(error) => {
            say!("subagents: check failed: {error}");
            return Ok(ExitCode::from(1));
        }
    };
    let mut failed = false;
    let mut rows: Vec<Row> = outcomes
        .into_iter()
        .map(|(name, outcome)| {
            let entry = config.provider(&name).expect("a provider of the file");
            let listed = Row::listed(config, entry);
            match outcome {
                Ok(registration) => {
                    let info = setup.subagents.provider(&name);
                    registration.keep();
                    let capabilities =
                        info.map_or_else(|| "not registered".to_owned(), |info| names(info.capabilities));
                    Row { capabilities, status: "ok".to_owned(), ..listed }
                }
                Err(error) => {
                    failed = true;
                    Row { status: format!("failed: {error}"), ..listed }
                }
            }
        })
        .collect();
    for row in rows.iter_mut().filter(|row| row.status == "ok") {
        let entry = config.provider(&row.name).expect("a provider of the file");
        row.mcp = mcp_tools(config, entry);
        if let Some((server, error)) = row.mcp.iter().find_map(|(server, tools)| Some((server, tools.as_ref().err()?)))
        {
            failed = true;
            row.status = format!("failed: MCP server {server:?}: {error}");
        }
    }
    print(&rows, json);
    drop(setup);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Each MCP server `entry` mounts, started, listed and closed: its tools'
/// names, or why it could not start.
fn mcp_tools(config: &Config, entry: &ProviderEntry) -> Vec<(String, Result<Vec<String>, String>)> {
    let servers = config.mcp_server_configs(entry);
    if servers.is_empty() {
        return Vec::new();
    }
    let io = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(io) => io,
        Err(error) => return vec![(String::new(), Err(format!("cannot start the runtime: {error}")))],
    };
    io.block_on(async {
        let mut listed = Vec::new();
        for server in servers.into_iter().map(subagents::agent::McpServer::new) {
            let tools = server.tools().await.map(|tools| tools.iter().map(|tool| tool.spec().name).collect());
            let tools = tools.map_err(|error| error.to_string());
            server.shutdown().await;
            listed.push((server.config().name.clone(), tools));
        }
        listed
    })
}

struct Row {
    name: String,
    kind: &'static str,
    capabilities: String,
    defined: String,
    /// `check`'s verdict: `ok` or `failed: why`; empty for `list`.
    status: String,
    /// `check`: each MCP server its children mount, with its tools.
    mcp: Vec<(String, Result<Vec<String>, String>)>,
}

impl Row {
    fn listed(config: &Config, entry: &ProviderEntry) -> Row {
        let defined = match entry.line() {
            0 => config.origin().to_string(),
            line => format!("{}:{line}", config.origin()),
        };
        let capabilities = match entry.kind().capabilities() {
            KindCapabilities::Fixed(capabilities) => names(capabilities),
            KindCapabilities::FromAgent => "from the agent's initialize (see check)".to_owned(),
            KindCapabilities::Wrapped => "the wrapped provider's".to_owned(),
            KindCapabilities::NotBuilt(feature) => format!("not built (feature {feature:?})"),
            _ => "unknown".to_owned(),
        };
        // What the environment lacks for it: shown, and only `check` fails for it.
        let status = entry.problem().map(|problem| format!("failed: {problem}")).unwrap_or_default();
        let (name, kind, mcp) = (entry.name().to_owned(), entry.kind().name(), Vec::new());
        Row { name, kind, capabilities, defined, status, mcp }
    }

    fn json(&self) -> Value {
        let mut row =
            json!({"name": self.name, "kind": self.kind, "capabilities": self.capabilities, "defined": self.defined});
        if let Some(error) = self.status.strip_prefix("failed: ") {
            row["ok"] = json!(false);
            row["error"] = json!(error);
        } else if self.status == "ok" {
            row["ok"] = json!(true);
        }
        if !self.mcp.is_empty() {
            let servers: Vec<Value> = self
                .mcp
                .iter()
                .map(|(server, tools)| match tools {
                    Ok(tools) => json!({"name": server, "tools": tools}),
                    Err(error) => json!({"name": server, "error": error}),
                })
                .collect();
            row["mcp_servers"] = Value::Array(servers);
        }
        row
    }
}

/// `output_schema, depth_limit, …`, or `none`.
fn names(capabilities: Capabilities) -> String {
    let all = [
        ("output_schema", capabilities.output_schema),
        ("depth_limit", capabilities.depth_limit),
        ("tool_filter", capabilities.tool_filter),
        ("persona", capabilities.persona),
        ("agent_options", capabilities.agent_options),
        ("mcp_servers", capabilities.mcp_servers),
    ];
    let on: Vec<&str> = all.iter().filter(|(_, on)| *on).map(|(name, _)| *name).collect();
    if on.is_empty() {
        "none".to_owned()
    } else {
        on.join(", ")
    }
}

fn print(rows: &[Row], json: bool) {
    if json {
        terminal::out(&Value::Array(rows.iter().map(Row::json).collect()).to_string());
        return;
    }
    let width = |column: fn(&Row) -> usize, title: &str| rows.iter().map(column).max().unwrap_or(0).max(title.len());
    let (name, kind) = (width(|r| r.name.chars().count(), "NAME"), width(|r| r.kind.len(), "KIND"));
    let capabilities = width(|r| r.capabilities.chars().count(), "CAPABILITIES");
    let checked = rows.iter().any(|row| !row.status.is_empty());
    let defined = width(|r| r.defined.chars().count(), "DEFINED");
    let mut title = format!("{:name$}  {:kind$}  {:capabilities$}  DEFINED", "NAME", "KIND", "CAPABILITIES");
    if checked {
        title = format!("{title:<width$}  STATUS", width = name + kind + capabilities + defined + 6);
    }
    terminal::out(&title);
    for row in rows {
        let mut line =
            format!("{:name$}  {:kind$}  {:capabilities$}  {}", row.name, row.kind, row.capabilities, row.defined);
        if checked {
            line = format!("{line:<width$}  {}", row.status, width = name + kind + capabilities + defined + 6);
        }
        terminal::out(&terminal::line(&line));
        for (server, tools) in &row.mcp {
            let tools = match tools {
                Ok(tools) if tools.is_empty() => "no tools".to_owned(),
                Ok(tools) => tools.join(", "),
                Err(error) => format!("failed: {error}"),
            };
            terminal::out(&terminal::line(&format!("  mcp {server}: {tools}")));
        }
    }
}
