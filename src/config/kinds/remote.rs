//! `kind = "remote"`: runs on `subagents worker` processes through NATS
//! JetStream.
//!
//! ```toml
//! [providers.fleet]
//! kind = "remote"
//! nats = "nats://127.0.0.1:4222"  # else $SUBAGENTS_NATS_URL
//! pool = "gpu"
//! broker_patience = "30s"
//! ```

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use serde::Deserialize;
use toml::de::DeValue;
use toml::Spanned;

use super::{BuildFailure, Building, Checked, Checking, Home, KindCapabilities};
use crate::config::keys::{self, fields_of};
use crate::config::values::expand;
use crate::config::ConfigError;
use crate::seam::Provider;

/// The homes this file keeps.
pub(super) static HOMES: &[&Home] = &[&HOME];

static HOME: Home = Home {
    name: "remote",
    what: "a remote provider",
    keys: || fields_of::<Table>().to_vec(),
    check,
    capabilities: CAPABILITIES,
};

#[cfg(feature = "remote")]
const CAPABILITIES: KindCapabilities = KindCapabilities::Fixed(crate::providers::RemoteProvider::DEFAULT_CAPABILITIES);
#[cfg(not(feature = "remote"))]
const CAPABILITIES: KindCapabilities = KindCapabilities::NotBuilt("remote");

/// The variable naming the broker when `nats` does not.
const NATS_ENV: &str = "SUBAGENTS_NATS_URL";

#[derive(Debug, Deserialize)]
struct Table {
    nats: Option<Spanned<String>>,
    /// A worker pool's name.
    pool: Option<Spanned<toml::Value>>,
    connect_timeout: Option<Spanned<String>>,
    publish_timeout: Option<Spanned<String>>,
    dispose_wait: Option<Spanned<String>>,
    broker_patience: Option<Spanned<String>>,
    worker_patience: Option<Spanned<String>>,
    detached_ttl: Option<Spanned<String>>,
}

#[derive(Debug)]
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
struct Remote {
    table: Table,
    pool: Option<String>,
    /// Each duration key the table sets, read.
    durations: Vec<(&'static str, Duration)>,
    /// Resolved: the broker's URL.
    nats: Option<String>,
}

fn check(checking: &Checking<'_, '_>, table: Spanned<DeValue<'_>>) -> Result<Box<dyn Checked>, ConfigError> {
    let table: Table = keys::read(checking.source, table)?;
    let pool = match &table.pool {
        Some(pool) => match pool.get_ref() {
            toml::Value::String(name) => Some(name.clone()),
            _ => {
                let message = "a remote provider's `pool` is a worker pool's name, such as \"default\"";
                return Err(checking.source.error(Some(pool.span()), message));
            }
        },
        None => None,
    };
    let mut durations = Vec::new();
    for (key, value) in [
        ("connect_timeout", &table.connect_timeout),
        ("publish_timeout", &table.publish_timeout),
        ("dispose_wait", &table.dispose_wait),
        ("broker_patience", &table.broker_patience),
        ("worker_patience", &table.worker_patience),
        ("detached_ttl", &table.detached_ttl),
    ] {
        if let Some(duration) = checking.duration(key, value)? {
            durations.push((key, duration));
        }
    }
    Ok(Box::new(Remote { table, pool, durations, nats: None }))
}

impl Checked for Remote {
    fn resolve(&mut self, checking: &Checking<'_, '_>) -> Result<(), ConfigError> {
        self.nats = match &self.table.nats {
            Some(nats) => Some(expand(checking.source, nats.get_ref(), nats.span())?),
            None => match std::env::var(NATS_ENV) {
                Ok(url) if !url.is_empty() => Some(url),
                _ => return Err(checking.needs("remote", "`nats` (or SUBAGENTS_NATS_URL)")),
            },
        };
        Ok(())
    }

    fn build<'a>(&'a self, building: Building<'a>) -> LocalBoxFuture<'a, Result<Arc<dyn Provider>, BuildFailure>> {
        let built = self.provider(building);
        async move { built }.boxed_local()
    }
}

impl Remote {
    #[cfg(feature = "remote")]
    fn provider(&self, building: Building<'_>) -> Result<Arc<dyn Provider>, BuildFailure> {
        use crate::providers::{RemoteConfig, RemoteProvider};
        let url = self.nats.clone().ok_or("its broker was not resolved")?;
        let mut config = RemoteConfig::new(building.name, url);
        if let Some(pool) = &self.pool {
            config = config.with_pool(pool.clone());
        }
        for (key, value) in &self.durations {
            let slot = match *key {
                "connect_timeout" => &mut config.connect_timeout,
                "publish_timeout" => &mut config.publish_timeout,
                "dispose_wait" => &mut config.dispose_wait,
                "broker_patience" => &mut config.broker_patience,
                "worker_patience" => &mut config.worker_patience,
                _ => &mut config.detached_ttl,
            };
            *slot = *value;
        }
        RemoteProvider::connect(config).map(|p| Arc::new(p) as Arc<dyn Provider>).map_err(BuildFailure::from)
    }

    #[cfg(not(feature = "remote"))]
    fn provider(&self, _: Building<'_>) -> Result<Arc<dyn Provider>, BuildFailure> {
        Err(super::FeatureOff { kind: "remote", feature: "remote" }.into())
    }
}
