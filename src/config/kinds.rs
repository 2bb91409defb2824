//! Each provider kind's home: one file per kind that owns its keys (the
//! fields of the struct that reads its table), their checks, the function
//! that builds its provider, and the capabilities `subagents providers
//! list` prints for it (the provider's own constant, never restated).
//! [`Config`](super::Config) only dispatches on [`Kind`].
//!
//! A kind's table is read in two steps. **Checking** reads what the file
//! says (its keys, their types, durations, required keys, chaos rules) and
//! refuses the whole file at the first fault, with its place. **Resolving**
//! reads what the environment says (`${VAR}`, a program on `PATH`, a
//! directory that must exist) and keeps a fault with the provider
//! ([`ProviderEntry::problem`](super::ProviderEntry::problem)): a provider
//! whose variable is unset blocks only the commands that use it.
//!
//! Adding a kind is a file here beside the provider's own, its name in the
//! providers' list of kinds, and its feature in `Cargo.toml`:
//!
//! ```
//! use subagents::config::{Config, Kind};
//!
//! let names: Vec<&str> = Kind::all().map(Kind::name).collect();
//! assert!(names.contains(&"spawn") && names.contains(&"acp"));
//! let error = Config::parse("[providers.a]\nkind = \"spawn\"\nrpm = 60\n", "example.toml").unwrap_err();
//! assert!(error.message().starts_with("`rpm` is a key of [models.NAME], not of a spawn provider"), "{error}");
//! ```

mod child_process;

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use toml::de::DeValue;
use toml::Spanned;

pub(super) use super::build::Building;
use super::keys::TableKeys;
use super::mcp_servers::McpServerEntry;
use super::{parse_duration, ConfigError, Source};
use crate::seam::{Capabilities, Provider};

/// One module per kind, in the order of the providers' list of kinds (the
/// order `subagents providers` and messages list them), each with its
/// `HOMES`.
macro_rules! homes {
    ($($kind:ident),*) => {
        $(mod $kind;)*

        /// Every kind, in order.
        fn homes() -> impl Iterator<Item = &'static Home> {
            [$($kind::HOMES),*].into_iter().flatten().copied()
        }
    };
}
crate::providers::kinds!(homes);

/// Why a kind could not build its provider: the provider's own error.
pub(super) type BuildFailure = Box<dyn std::error::Error + Send + Sync>;

/// A kind whose provider this build of the crate leaves out.
#[derive(Debug, thiserror::Error)]
#[error("{kind} providers need the crate's {feature:?} feature")]
#[cfg_attr(
    all(feature = "a2a", feature = "acp", feature = "process", feature = "remote", feature = "mcp-client"),
    allow(dead_code)
)]
pub(super) struct FeatureOff {
    pub(super) kind: &'static str,
    pub(super) feature: &'static str,
}

/// A kind's check of its table.
pub(super) type CheckFn = fn(&Checking<'_, '_>, Spanned<DeValue<'_>>) -> Result<Box<dyn Checked>, ConfigError>;

/// One kind's home: what the dispatch needs from its file.
pub(super) struct Home {
    /// `kind = "NAME"`.
    pub(super) name: &'static str,
    /// How a message names a provider of it: `a spawn provider`.
    pub(super) what: &'static str,
    /// Its keys besides `kind`: the fields of its table's structs.
    pub(super) keys: fn() -> Vec<&'static str>,
    /// Checks its table (its keys already are) into a provider to resolve and build.
    pub(super) check: CheckFn,
    /// What `providers list` says it advertises.
    pub(super) capabilities: KindCapabilities,
}

/// A provider's kind: the value of its `kind` key.
#[derive(Clone, Copy)]
pub struct Kind(&'static Home);

impl Kind {
    /// Every kind this crate knows (built or not), in a fixed order.
    pub fn all() -> impl Iterator<Item = Kind> {
        homes().map(Kind)
    }

    /// The kind the file spells `name`.
    pub fn named(name: &str) -> Option<Kind> {
        Kind::all().find(|kind| kind.name() == name)
    }

    /// The kind's name as the file spells it.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The start-time capabilities a provider of this kind advertises,
    /// as far as the file can tell.
    pub fn capabilities(self) -> KindCapabilities {
        self.0.capabilities
    }

    /// The keys a table of this kind takes (besides `kind`).
    pub fn keys(self) -> Vec<&'static str> {
        (self.0.keys)()
    }

    pub(super) fn home(self) -> &'static Home {
        self.0
    }

    /// This kind's keys, for messages.
    pub(super) fn table_keys(self) -> TableKeys {
        let mut keys = self.keys();
        keys.insert(0, "kind");
        TableKeys { what: self.0.what, place: self.0.what, keys }
    }
}

impl PartialEq for Kind {
    fn eq(&self, other: &Kind) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Kind {}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Kind").field(&self.name()).finish()
    }
}

/// What a provider of a kind advertises at start, as `subagents providers
/// list` shows it before anything is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KindCapabilities {
    /// Always these: the provider's own constant.
    Fixed(Capabilities),
    /// Learnt from the agent when it is built (an ACP agent's `initialize`).
    FromAgent,
    /// The wrapped provider's.
    Wrapped,
    /// This build lacks the kind: the feature that brings it.
    NotBuilt(&'static str),
}

/// What a kind's check may read besides its table.
pub(super) struct Checking<'s, 'a> {
    pub(super) source: &'s Source<'a>,
    /// The provider's name.
    pub(super) name: &'s str,
    /// Where its `kind` stands: a missing key is reported there.
    pub(super) kind_span: Range<usize>,
    /// The file's `[mcp_servers]`, resolved.
    pub(super) mcp_servers: &'s [McpServerEntry],
}

impl Checking<'_, '_> {
    /// `provider "NAME" of kind "KIND" needs …`, at its `kind`.
    pub(super) fn needs(&self, kind: &str, what: &str) -> ConfigError {
        let message = format!("provider {:?} of kind {kind:?} needs {what}", self.name);
        self.source.error(Some(self.kind_span.clone()), message)
    }

    /// `value` as a duration, or the error at its place naming `key`.
    pub(super) fn duration(&self, key: &str, value: &Option<Spanned<String>>) -> Result<Option<Duration>, ConfigError> {
        let Some(value) = value else { return Ok(None) };
        let duration = parse_duration(value.get_ref())
            .map_err(|e| self.source.error(Some(value.span()), format!("`{key}`: {e}")))?;
        Ok(Some(duration))
    }
}

/// A provider's table, checked: resolved against the environment when the
/// file is read, built when a command uses it.
pub(super) trait Checked: fmt::Debug + Send + Sync {
    /// Reads what the environment must hold (`${VAR}`, programs,
    /// directories); a fault is kept with the provider, not the file.
    fn resolve(&mut self, _: &Checking<'_, '_>) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The provider it wraps (`chaos`), built first.
    fn wraps(&self) -> Option<&Spanned<String>> {
        None
    }

    /// The model it runs its children on in this process (a route or a
    /// command-line form, checked when the file is read).
    fn in_process_model(&self) -> Option<&Spanned<String>> {
        None
    }

    /// Whether it is an in-process kind: its models come from the caller.
    fn in_process(&self) -> bool {
        false
    }

    /// `mcp_servers = [...]`: the servers its children mount.
    fn mcp_servers(&self) -> Option<&Spanned<Vec<Spanned<String>>>> {
        None
    }

    /// Builds its provider.
    fn build<'a>(&'a self, building: Building<'a>) -> LocalBoxFuture<'a, Result<Arc<dyn Provider>, BuildFailure>>;
}

/// The kind `kind` names, or an error at its place naming the kinds.
pub(super) fn kind_of(
    source: &Source<'_>,
    kind: Option<&Spanned<DeValue<'_>>>,
    table_span: Range<usize>,
) -> Result<(Kind, Range<usize>), ConfigError> {
    let known: Vec<&str> = Kind::all().map(Kind::name).collect();
    let Some(kind) = kind else {
        let message = format!("a provider needs a `kind`: {}", known.join(", "));
        return Err(source.error(Some(table_span), message));
    };
    let Some(name) = kind.get_ref().as_str() else {
        return Err(source.error(Some(kind.span()), format!("`kind` is a name: {}", known.join(", "))));
    };
    match Kind::named(name) {
        Some(found) => Ok((found, kind.span())),
        None => {
            let hint = crate::actors::nearest(name, known.iter().copied())
                .map(|near| format!(" (did you mean {near:?}?)"))
                .unwrap_or_default();
            let message = format!("unknown kind {}{hint}: {}", super::bounds::quoted(name), known.join(", "));
            Err(source.error(Some(kind.span()), message))
        }
    }
}

/// Reads one kind's table: its keys checked (a key of another table named
/// with where it belongs), then its values.
pub(super) fn check(
    checking: &Checking<'_, '_>,
    kind: Kind,
    table: Spanned<DeValue<'_>>,
    elsewhere: &[TableKeys],
) -> Result<Box<dyn Checked>, ConfigError> {
    super::keys::check(checking.source, &table, &kind.table_keys(), elsewhere)?;
    (kind.home().check)(checking, table)
}
