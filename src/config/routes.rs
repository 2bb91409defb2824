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

/// Every route of the file, in file order, each checked.
pub(super) fn resolve(
    source: &Source<'_>,
    tables: indexmap::IndexMap<String, Spanned<RouteTable>>,
) -> Result<Vec<Arc<ModelRoute>>, ConfigError> {
    let mut routes = Vec::with_capacity(tables.len());
    for (name, table) in tables {
        let span = table.span();
        let table = table.into_inner();
        if name == "scripted" || name.contains(':') {
            let message = format!("route name {name:?} would read as a model of the command line: pick another");
            return Err(source.error(Some(span), message));
        }
        routes.push(Arc::new(route(source, &name, &table)?));
    }
    Ok(routes)
}

fn route(source: &Source<'_>, name: &str, table: &RouteTable) -> Result<ModelRoute, ConfigError> {
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
    if let Some(variable) = &table.api_key_env {
        let key = std::env::var(variable.get_ref()).ok().filter(|key| !key.trim().is_empty());
        let Some(key) = key else {
            let message = format!("`api_key_env` names {:?}, which is not set in the environment", variable.get_ref());
            return Err(source.error(Some(variable.span()), message));
        };
        // It goes in a header of every request.
        if !crate::agent::header_value_fits(&key) {
            let message = format!(
                "`api_key_env`: the value of {} has a character an HTTP header cannot carry",
                variable.get_ref()
            );
            return Err(source.error(Some(variable.span()), message));
        }
        route.api_key = Some(key);
    }
    if let Some(timeout) = &table.timeout {
        let duration = parse_positive_duration(timeout.get_ref())
            .map_err(|e| source.error(Some(timeout.span()), format!("`timeout`: {e}")))?;
        route.timeout = Some(duration);
    }
    route.max_tokens = table.max_tokens.as_ref().map(|v| *v.get_ref());
    route.retries = table.retries.as_ref().map(|v| *v.get_ref());
    Ok(route)
}

/// The model `spec` names: a route of the file, else a command-line form.
pub(super) fn spec(routes: &[Arc<ModelRoute>], spec: &str) -> Result<ModelSpec, UnknownModel> {
    if let Some(route) = routes.iter().find(|route| route.name == spec) {
        return Ok(ModelSpec::Route(route.clone()));
    }
    ModelSpec::parse(spec).map_err(|_| UnknownModel {
        spec: spec.to_owned(),
        routes: routes.iter().map(|route| route.name.clone()).collect(),
    })
}

/// A `--model` or a provider's `model` that is neither a route of the file
/// nor a command-line form ([`Config::model_spec`](super::Config::model_spec)).
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

/// Every in-process provider's `model` names something that exists.
pub(super) fn check_models(
    source: &Source<'_>,
    providers: &[ProviderEntry],
    routes: &[Arc<ModelRoute>],
) -> Result<(), ConfigError> {
    for entry in providers {
        if let Some(model) = entry.checked.in_process_model() {
            spec(routes, model.get_ref()).map_err(|why| source.error(Some(model.span()), why.to_string()))?;
        }
    }
    Ok(())
}
