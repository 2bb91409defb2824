//! `subagents providers list|check`: the providers a configuration defines.
//!
//! `list` reads the file only: each provider's name, kind, the start-time
//! capabilities its kind advertises, and where it is defined. `check`
//! builds every provider as `run` and `fanout` would (an ACP agent answers
//! `initialize`, a model endpoint is probed, a NATS server is connected, a
//! process child's binary is found) and lists what each one advertises
//! once built; exit 1 when one cannot be built.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};
use subagents::config::{Config, Kind, ProviderEntry};
use subagents::Capabilities;

use crate::setup::{setup, ConfigArgs, RemoteArgs};
use crate::terminal::{self, say};

#[derive(clap::Args)]
pub struct ProvidersArgs {
    #[command(subcommand)]
    query: Query,
    #[command(flatten)]
    config: ConfigArgs,
    /// Print one JSON document instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum Query {
    /// Name, kind, capabilities and where each provider is defined.
    List,
    /// Build every provider (probing agents, endpoints and brokers) and
    /// list what each one advertises; exit 1 when one fails.
    Check {
        /// The children's default model: `scripted`, `openai:NAME` or a route.
        #[arg(long, default_value = "scripted")]
        model: String,
        /// Where sessions are kept (default `$SUBAGENTS_HOME`, else `.subagents`).
        #[arg(long)]
        home: Option<PathBuf>,
    },
}

pub fn providers(args: ProvidersArgs) -> Result<ExitCode, String> {
    let config = args.config.load()?;
    match args.query {
        Query::List => {
            let rows: Vec<Row> = config.providers().iter().map(|entry| Row::listed(&config, entry)).collect();
            print(&rows, args.json);
            Ok(ExitCode::SUCCESS)
        }
        Query::Check { model, home } => check(&config, &model, home, args.json),
    }
}

fn check(config: &Config, model: &str, home: Option<PathBuf>, json: bool) -> Result<ExitCode, String> {
    let setup = match setup(model, home, "", &RemoteArgs::default(), config) {
        Ok(setup) => setup,
        Err(error) => {
            say!("subagents: check failed: {error}");
            return Ok(ExitCode::from(1));
        }
    };
    let rows: Vec<Row> = config
        .providers()
        .iter()
        .map(|entry| {
            let info = setup.subagents.get_provider(entry.name());
            let capabilities = info.map_or_else(|| "not registered".to_owned(), |info| names(info.capabilities));
            Row { capabilities, ..Row::listed(config, entry) }
        })
        .collect();
    print(&rows, json);
    setup.runtime.shutdown_blocking();
    Ok(ExitCode::SUCCESS)
}

struct Row {
    name: String,
    kind: &'static str,
    capabilities: String,
    defined: String,
}

impl Row {
    fn listed(config: &Config, entry: &ProviderEntry) -> Row {
        let defined = match entry.line() {
            0 => config.origin().to_string(),
            line => format!("{}:{line}", config.origin()),
        };
        let capabilities = match entry.kind() {
            Kind::Spawn | Kind::Fork | Kind::Mock | Kind::Remote => names(Capabilities::all()),
            Kind::Process => names(Capabilities { agent_options: true, ..Capabilities::none() }),
            Kind::Acp => "from the agent's initialize (see check)".to_owned(),
            Kind::Chaos => "the wrapped provider's".to_owned(),
        };
        Row { name: entry.name().to_owned(), kind: entry.kind().name(), capabilities, defined }
    }

    fn json(&self) -> Value {
        json!({"name": self.name, "kind": self.kind, "capabilities": self.capabilities, "defined": self.defined})
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
        println!("{}", Value::Array(rows.iter().map(Row::json).collect()));
        return;
    }
    let width = |column: fn(&Row) -> usize, title: &str| rows.iter().map(column).max().unwrap_or(0).max(title.len());
    let (name, kind) = (width(|r| r.name.chars().count(), "NAME"), width(|r| r.kind.len(), "KIND"));
    let capabilities = width(|r| r.capabilities.chars().count(), "CAPABILITIES");
    println!("{:name$}  {:kind$}  {:capabilities$}  DEFINED", "NAME", "KIND", "CAPABILITIES");
    for row in rows {
        let line =
            format!("{:name$}  {:kind$}  {:capabilities$}  {}", row.name, row.kind, row.capabilities, row.defined);
        println!("{}", terminal::line(&line));
    }
}
