//! `[models.NAME]` tables into [`ModelRoute`]s, checked when the file is
//! read, and the check that every in-process provider's `model` names a
//! route or a model the command line could name (`scripted`,
//! `openai:NAME`, `openai-responses:NAME`, `anthropic:NAME`).
//!
//! ```toml
//! [models.fast]
//! api = "openai-chat"            # or "openai-responses", "anthropic"
//! base_url = "http://127.0.0.1:8000/v1"
//! api_key_env = "OPENAI_API_KEY" # the variable holding the key
//! model = "gpt-4o-mini"
//! max_tokens = 1024
//! timeout = "60s"
//! retries = 3
//! rpm = 300                       # requests a minute, for every run in the process
//! tpm = 200000                    # tokens a minute
//! max_concurrent = 32             # calls in flight
//! shared = false                  # true: the limits bind every `remote` worker together
//!
//! [providers.spawn]
//! kind = "spawn"
//! model = "fast"
//! ```

use std::sync::Arc;

use toml::Spanned;

use super::schema::{ApiName, RouteTable};
use super::values::http_url;
use super::{parse_positive_duration, ConfigError, ProviderEntry, Source};
use crate::agent::{Api, ModelRoute, ModelSpec, RouteLimits, MODEL_FORMS};

/// A route of the file, and what this environment lacks to serve it (its
/// key's variable unset): a fault that stays with the route, so only a
/// command that uses it fails.
#[derive(Debug)]
pub(super) struct RouteEntry {
    pub(super) route: Arc<ModelRoute>,
    pub(super) problem: Option<ConfigError>,
}

/// Every route of the file, in file order, each checked.
pub(super) fn resolve(
    source: &Source<'_>,
    tables: indexmap::IndexMap<String, Spanned<RouteTable>>,
) -> Result<Vec<RouteEntry>, ConfigError> {
    let mut routes = Vec::with_capacity(tables.len());
    for (name, table) in tables {
        let span = table.span();
        let table = table.into_inner();
        if name == "scripted" || name.contains(':') {
            let message = format!("route name {name:?} would read as a model of the command line: pick another");
            return Err(source.error(Some(span), message));
        }
        let (route, problem) = route(source, &name, &table)?;
        routes.push(RouteEntry { route: Arc::new(route), problem });
    }
    Ok(routes)
}

fn route(
    source: &Source<'_>,
    name: &str,
    table: &RouteTable,
) -> Result<(ModelRoute, Option<ConfigError>), ConfigError> {
    let api = match table.api.get_ref() {
        ApiName::OpenAiChat => Api::OpenAiChat,
        ApiName::OpenAiResponses => Api::OpenAiResponses,
        ApiName::Anthropic => Api::Anthropic,
    };
    api.check_built().map_err(|why| source.error(Some(table.api.span()), format!("route {name:?}: {why}")))?;
    let at_least_one = |key: &str, value: Option<u64>, span: Option<std::ops::Range<usize>>| {
        if value == Some(0) {
            return Err(source.error(span, format!("`{key}` must be at least 1 (leave it out for no limit)")));
        }
        Ok(())
    };
    at_least_one("rpm", table.rpm.as_ref().map(|v| u64::from(*v.get_ref())), table.rpm.as_ref().map(Spanned::span))?;
    at_least_one("tpm", table.tpm.as_ref().map(|v| *v.get_ref()), table.tpm.as_ref().map(Spanned::span))?;
    let concurrent = &table.max_concurrent;
    at_least_one(
        "max_concurrent",
        concurrent.as_ref().map(|v| u64::from(*v.get_ref())),
        concurrent.as_ref().map(Spanned::span),
    )?;
    at_least_one(
        "max_tokens",
        table.max_tokens.as_ref().map(|v| u64::from(*v.get_ref())),
        table.max_tokens.as_ref().map(Spanned::span),
    )?;
    let model = table.model.get_ref().trim();
    if model.is_empty() {
        return Err(source.error(Some(table.model.span()), format!("route {name:?} needs a `model` name")));
    }
    let limits = RouteLimits {
        requests_per_minute: table.rpm.as_ref().map(|v| *v.get_ref()),
        tokens_per_minute: table.tpm.as_ref().map(|v| *v.get_ref()),
        max_concurrent: table.max_concurrent.as_ref().map(|v| *v.get_ref()),
    };
    let mut route = ModelRoute::new(name, api, model, limits);
    if let Some(base_url) = &table.base_url {
        route.base_url = Some(http_url(source, "base_url", base_url)?);
    }
    let mut problem = None;
    if let Some(variable) = &table.api_key_env {
        let key = std::env::var(variable.get_ref()).ok().filter(|key| !key.trim().is_empty());
        match key {
            None => {
                let message = format!(
                    "route {name:?}: `api_key_env` names {:?}, which is not set in the environment",
                    variable.get_ref()
                );
                problem = Some(source.error(Some(variable.span()), message));
            }
            // It goes in a header of every request.
            Some(key) if !crate::agent::header_value_fits(&key) => {
                let message = format!(
                    "route {name:?}: `api_key_env`: the value of {} has a character an HTTP header cannot carry",
                    variable.get_ref()
                );
                problem = Some(source.error(Some(variable.span()), message));
            }
            Some(key) => route.api_key = Some(key),
        }
    }
    if let Some(timeout) = &table.timeout {
        let duration = parse_positive_duration(timeout.get_ref())
            .map_err(|e| source.error(Some(timeout.span()), format!("`timeout`: {e}")))?;
        route.timeout = Some(duration);
    }
    route.max_tokens = table.max_tokens.as_ref().map(|v| *v.get_ref());
    route.retries = table.retries.as_ref().map(|v| *v.get_ref());
    route.shared = table.shared.as_ref().is_some_and(|v| *v.get_ref());
    Ok((route, problem))
}

/// The model `spec` names: a route of the file, else a command-line form.
pub(super) fn spec(routes: &[RouteEntry], spec: &str) -> Result<ModelSpec, ModelError> {
    if let Some(entry) = routes.iter().find(|entry| entry.route.name == spec) {
        return match &entry.problem {
            Some(problem) => Err(ModelError::Unusable(problem.clone())),
            None => Ok(ModelSpec::Route(entry.route.clone())),
        };
    }
    ModelSpec::parse(spec).map_err(|_| {
        ModelError::Unknown(UnknownModel {
            spec: spec.to_owned(),
            routes: routes.iter().map(|entry| entry.route.name.clone()).collect(),
        })
    })
}

/// Why [`Config::model_spec`](super::Config::model_spec) has no model for a name.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Neither a route of the file nor a command-line form.
    #[error(transparent)]
    Unknown(#[from] UnknownModel),
    /// A route of the file that this environment cannot serve (its key's
    /// variable is unset): where and why.
    #[error("{0}")]
    Unusable(ConfigError),
}

/// A `--model` or a provider's `model` that is neither a route of the file
/// nor a command-line form.
#[derive(Clone, Debug, thiserror::Error)]
#[error("unknown model {spec:?}: not a [models] route ({}), {MODEL_FORMS}", routes_named(.routes))]
pub struct UnknownModel {
    /// What was asked for.
    pub spec: String,
    /// The routes the file defines.
    pub routes: Vec<String>,
}

fn routes_named(routes: &[String]) -> String {
    if routes.is_empty() {
        "none defined".to_owned()
    } else {
        routes.join(", ")
    }
}

/// Every in-process provider's `model` names something that exists; a
/// provider whose route this environment cannot serve takes the route's
/// problem as its own (it blocks only the commands that use it).
pub(super) fn check_models(
    source: &Source<'_>,
    providers: &mut [ProviderEntry],
    routes: &[RouteEntry],
) -> Result<(), ConfigError> {
    for entry in providers {
        let Some(model) = entry.checked.in_process_model() else { continue };
        match spec(routes, model.get_ref()) {
            Ok(_) => {}
            Err(ModelError::Unusable(problem)) => {
                entry.problem.get_or_insert(problem);
            }
            Err(ModelError::Unknown(why)) => return Err(source.error(Some(model.span()), why.to_string())),
        }
    }
    Ok(())
}
