//! A supervised runtime in which one AI agent delegates work to child agents
//! ("subagents") through named providers.
//!
//! A parent starts a *run* on a provider (an in-process agent on a model, an
//! ACP coding agent, a fresh process, a worker across a NATS broker, an
//! Agent2Agent server, a scripted mock, or one of your own) and owns it: it
//! reads the run's [`RunResult`], may cancel it (down its whole tree, with a
//! [`Receipt`] of what stopped) and disposes it. Every run is an actor under
//! one registry, held to a [`Budget`] if it has one, and nothing is left
//! alive after [`Runtime::shutdown_blocking`]. The `subagents` binary (feature
//! `cli`) opens the same runtime to the command line, MCP, ACP and A2A
//! clients; its guide is the book in `docs/` of the repository.
//!
//! # Three doors
//!
//! - **The root**: the names most programs use ([`Runtime`],
//!   [`Subagents`], [`Run`], [`StartRequest`], [`Parent`], [`RunResult`],
//!   [`StopReason`], [`CancellationToken`], …), and [`prelude`] to import
//!   them with the built-in providers in one line.
//! - **Modules for each part**: [`providers`] (the built-in providers),
//!   [`events`] (watching runs), `agent` and `tool` (the in-process agent and
//!   the model-facing subagent tool), `config` (the configuration file),
//!   `batch` (the engine of `subagents fanout`), `serve` (the server side of
//!   each door), [`workspace`] (a git worktree per run, and merging the
//!   branches back), [`schema`] and [`telemetry`].
//! - **[`seam`] for those who extend**: the whole provider contract in one
//!   module ([`seam::Provider`], [`seam::Child`]), with a worked example.
//!
//! # Example
//!
//! ```
//! use subagents::providers::MockProvider;
//! use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};
//!
//! let runtime = Runtime::builder().build().unwrap();
//! let subagents = runtime.subagents();
//! subagents.register_provider(MockProvider::new("mock").with_reply("42")).unwrap().keep();
//!
//! let result = runtime.block_on(async move {
//!     let request = StartRequest::new("What is six times seven?", Parent::root("/tmp"), CancellationToken::new());
//!     let run = subagents.start("mock", request).await.unwrap();
//!     let result = run.result().await.unwrap();
//!     run.dispose().await.unwrap(); // the caller owns the run: always dispose
//!     result
//! });
//! assert_eq!(result.stop_reason, StopReason::Completed);
//! assert_eq!(result.text(), "42");
//! assert!(runtime.shutdown_blocking().live_after.is_quiescent());
//! ```
//!
//! [`Runtime`] owns its threads, so this works from plain threads or any
//! tokio runtime; [`Runtime::block_on`] runs your code on one of its workers,
//! next to the runs it starts.
//!
//! # Features
//!
//! Without default features the crate is the core: the runtime, [`seam`],
//! [`events`], the registry and the `mock` and `chaos` providers. Each
//! feature adds one part and the crates it needs; `default` is `cli`, which
//! is everything.
//!
//! | feature | adds | pulls in |
//! |---|---|---|
//! | `agent` | the in-process agent (sessions, the turn loop, `read_file`/`list_dir`, scripted and replay models), the `spawn` and `fork` providers, the model-facing `subagent` tool and background tasks | uuid, cap-std, jsonschema |
//! | `openai` | the HTTP model adapters: OpenAI-compatible chat completions, OpenAI Responses, Anthropic Messages (implies `agent`) | reqwest, rustls (ring) |
//! | `acp` | the `acp` provider; with `agent` also `subagents acp`'s server side | agent-client-protocol, nix |
//! | `process` | the `process` provider and `subagents serve` (implies `agent`) | nix |
//! | `remote` | the `remote` provider and `subagents worker` (implies `process`) | async-nats |
//! | `mcp-client` | the MCP servers whose tools children mount, over stdio or streamable HTTP (implies `agent`) | rmcp (client), reqwest, rustls, nix |
//! | `mcp-server` | `subagents mcp`'s server side (implies `process`) | rmcp (server) |
//! | `mcp` | both sides of MCP | |
//! | `config` | the configuration file: named providers of every kind built in, model routes (implies `agent`) | toml, indexmap |
//! | `batch` | `subagents fanout`'s engine: task lines, a durable results journal, resume (implies `config`) | none more |
//! | `a2a` | the `a2a` provider; with `config` also `subagents a2a`'s server side (implies `agent`) | reqwest, rustls, hyper's HTTP/1 server |
//! | `otel` | OTLP export of the runs' spans | opentelemetry, opentelemetry_sdk, opentelemetry-otlp, tracing-opentelemetry, tracing-subscriber |
//! | `testing` | `testing`: the conformance and fault kit for providers of your own | none more |
//! | `cli` | the `subagents` binary: every feature above | clap, indicatif, tracing-subscriber, tracing-chrome |
//!
//! The rules the runtime keeps, each pinned by a test, are the behaviour
//! contract, `docs/contract.md` in the repository.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use)]
#![forbid(unsafe_code)]

mod actors;
#[cfg(feature = "agent")]
#[cfg_attr(docsrs, doc(cfg(feature = "agent")))]
pub mod agent;
#[cfg(feature = "batch")]
#[cfg_attr(docsrs, doc(cfg(feature = "batch")))]
pub mod batch;
#[cfg(any(feature = "acp", feature = "process", feature = "mcp-client"))]
mod child_process;
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub mod config;
mod contain;
pub mod events;
mod files;
mod live;
mod mix;
pub mod prelude;
pub mod providers;
pub mod schema;
pub mod seam;
#[cfg(any(
    all(feature = "acp", feature = "agent"),
    all(feature = "a2a", feature = "config"),
    feature = "mcp-server",
    feature = "process",
    feature = "remote"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        all(feature = "acp", feature = "agent"),
        all(feature = "a2a", feature = "config"),
        feature = "mcp-server",
        feature = "process",
        feature = "remote"
    )))
)]
pub mod serve;
mod sync;
pub mod telemetry;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
#[cfg(any(feature = "openai", feature = "a2a", feature = "mcp-client"))]
mod tls;
#[cfg(feature = "agent")]
#[cfg_attr(docsrs, doc(cfg(feature = "agent")))]
pub mod tool;
#[cfg(any(feature = "a2a", feature = "acp", feature = "process"))]
mod wire;
pub mod workspace;

pub use actors::{
    Continuation, PhaseReport, Registration, Run, Runtime, RuntimeBuilder, RuntimeTask, ScopedRegistration,
    ShutdownReport, Steering, Subagents,
};
pub use events::SubagentEvent;
pub use seam::{
    AgentOptions, Budget, BudgetLease, ContentBlock, Detached, DisposeError, Parent, Receipt, RegisterError, RunResult,
    StartError, StartRequest, SteeringError, StopReason, SubagentError, ToolFilter,
};
pub use tokio_util::sync::CancellationToken;

/// The Rust examples of the README and the guide (`docs/src`), compiled and
/// run as doc tests so that they cannot rot. They use every door, so they
/// run with the `cli` feature (the default).
#[cfg(all(doctest, feature = "cli"))]
mod guide_examples {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/src/embedding.md")]
    struct Embedding;
    #[doc = include_str!("../docs/src/budgets.md")]
    struct Budgets;
    #[doc = include_str!("../docs/src/receipts.md")]
    struct Receipts;
    #[doc = include_str!("../docs/src/providers.md")]
    struct Providers;
    #[doc = include_str!("../docs/src/testing.md")]
    struct Testing;
}
