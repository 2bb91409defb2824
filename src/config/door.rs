//! A configuration at one of the served doors (`subagents mcp`, `acp`,
//! `worker`): the file's providers, registered on the door's runtime, and
//! the ones its subagent tool offers.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::{BuildError, Config};
use crate::agent::{Model, Tool};
use crate::tool::{delegating_tool_list, TaskService};
use crate::Subagents;

/// A door's providers from a file, and what its subagent tool offers.
#[derive(Clone, Debug)]
pub struct Configured {
    /// The configuration, read and checked.
    pub config: Arc<Config>,
    /// The providers the door's subagent tool offers by name, the first as
    /// `subagent` (an MCP call starts its children on it).
    pub offered: Vec<String>,
}

/// Why a door cannot offer the providers it was asked for ([`Configured::new`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OfferError {
    /// `--provider` names none of the file's providers.
    #[error("unknown provider {name:?} (the configuration defines {})", .known.join(", "))]
    UnknownProvider {
        /// The name asked for.
        name: String,
        /// The providers the file defines, in file order.
        known: Vec<String>,
    },
    /// The file defines no provider at all.
    #[error("the configuration defines no provider")]
    NoProvider,
}

impl Configured {
    /// `provider` alone when given (the file must define it), else what
    /// `[tool]` offers.
    pub fn new(config: Config, provider: Option<&str>) -> Result<Configured, OfferError> {
        let offered = match provider {
            Some(provider) if config.provider(provider).is_some() => vec![provider.to_owned()],
            Some(provider) => {
                let known = config.provider_names().map(str::to_owned).collect();
                return Err(OfferError::UnknownProvider { name: provider.to_owned(), known });
            }
            None => config.tool_providers().to_vec(),
        };
        if offered.is_empty() {
            return Err(OfferError::NoProvider);
        }
        Ok(Configured { config: Arc::new(config), offered })
    }

    /// The provider an MCP call starts its children on: the first offered.
    pub fn provider(&self) -> &str {
        &self.offered[0]
    }

    /// Builds and registers every provider of the file on `subagents`
    /// (kept for the registry's life): the offered ones must build; another
    /// that cannot (an unset `${VAR}`, say) is left out with a warning. In-process providers without a
    /// `model` get `default`; the others build theirs from the name, a
    /// route of the file or a command-line form
    /// ([`Config::model_spec`]), one model per name, so the providers
    /// naming one route share its model and its limiter. Call it outside
    /// any async runtime: an `acp` provider's `initialize` probe runs on a
    /// private one.
    pub fn register_blocking(
        &self,
        subagents: &Subagents,
        tasks: &TaskService,
        home: &Path,
        default: Arc<dyn Model>,
    ) -> Result<(), BuildError> {
        let built = Mutex::new(HashMap::<String, Arc<dyn Model>>::new());
        let models = |named: Option<&str>| -> Result<Arc<dyn Model>, String> {
            let Some(named) = named else { return Ok(default.clone()) };
            let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(model) = built.get(named) {
                return Ok(model.clone());
            }
            let model = self.config.model_spec(named).map_err(|e| e.to_string())?.build().map_err(|e| e.to_string())?;
            built.insert(named.to_owned(), model.clone());
            Ok(model)
        };
        let context = super::BuildContext { subagents, tasks, home, models: &models, probe: false };
        let used: Vec<&str> = self.offered.iter().map(String::as_str).collect();
        for (name, outcome) in self.config.register_used_blocking(&context, &used)? {
            match outcome {
                Ok(registration) => registration.keep(),
                Err(error) => {
                    tracing::warn!(provider = %name, %error, "a provider the door does not offer is left out")
                }
            }
        }
        Ok(())
    }

    /// `builtins`, a subagent tool per offered provider (depth capped by
    /// `[tool] max_depth` where the provider enforces one) and the task
    /// tools, once every provider is registered.
    pub fn tools(&self, subagents: &Subagents, tasks: &TaskService, builtins: &[Arc<dyn Tool>]) -> Vec<Arc<dyn Tool>> {
        delegating_tool_list(subagents, tasks, builtins, &self.offered, self.config.tool_max_depth())
    }
}
