//! `kind = "a2a"`: a task on a remote Agent2Agent agent.
//!
//! ```toml
//! [providers.helper]
//! kind = "a2a"
//! url = "https://agents.example/helper"
//! headers = { Authorization = "Bearer ${A2A_TOKEN}" }
//! skill = "summarise"
//! idle_timeout = "2m"
//! ```

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use indexmap::IndexMap;
use serde::Deserialize;
use toml::de::DeValue;
use toml::Spanned;

use super::{BuildFailure, Building, Checked, Checking, Home, KindCapabilities};
use crate::config::keys::{self, fields_of};
use crate::config::values::{check_written_http, http_headers, http_url};
use crate::config::ConfigError;
use crate::seam::Provider;

/// The homes this file keeps.
pub(super) static HOMES: &[&Home] = &[&HOME];

static HOME: Home = Home {
    name: "a2a",
    what: "an a2a provider",
    keys: || fields_of::<Table>().to_vec(),
    check,
    capabilities: CAPABILITIES,
};

#[cfg(feature = "a2a")]
const CAPABILITIES: KindCapabilities = KindCapabilities::Fixed(crate::providers::A2aProvider::CAPABILITIES);
#[cfg(not(feature = "a2a"))]
const CAPABILITIES: KindCapabilities = KindCapabilities::NotBuilt("a2a");

#[derive(Debug, Deserialize)]
#[cfg_attr(not(feature = "a2a"), allow(dead_code))]
struct Table {
    url: Option<Spanned<String>>,
    headers: Option<Spanned<IndexMap<String, Spanned<String>>>>,
    skill: Option<Spanned<String>>,
    connect_timeout: Option<Spanned<String>>,
    card_timeout: Option<Spanned<String>>,
    first_event_timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
}

#[derive(Debug)]
#[cfg_attr(not(feature = "a2a"), allow(dead_code))]
struct A2a {
    table: Table,
    /// Each duration key the table sets, read.
    durations: Vec<(&'static str, Duration)>,
    /// Resolved: the URL and headers, `${VAR}`-expanded.
    url: Option<String>,
    headers: Vec<(String, String)>,
}

fn check(checking: &Checking<'_, '_>, table: Spanned<DeValue<'_>>) -> Result<Box<dyn Checked>, ConfigError> {
    let table: Table = keys::read(checking.source, table)?;
    if table.url.is_none() {
        return Err(checking.needs("a2a", "a `url`"));
    }
    let headers = table.headers.as_ref().map(Spanned::get_ref);
    check_written_http(checking.source, table.url.as_ref(), headers, crate::agent::header_problem)?;
    let mut durations = Vec::new();
    for (key, value) in [
        ("connect_timeout", &table.connect_timeout),
        ("card_timeout", &table.card_timeout),
        ("first_event_timeout", &table.first_event_timeout),
        ("idle_timeout", &table.idle_timeout),
    ] {
        if let Some(duration) = checking.duration(key, value)? {
            durations.push((key, duration));
        }
    }
    Ok(Box::new(A2a { table, durations, url: None, headers: Vec::new() }))
}

impl Checked for A2a {
    fn resolve(&mut self, checking: &Checking<'_, '_>) -> Result<(), ConfigError> {
        let url = self.table.url.as_ref().expect("checked");
        self.url = Some(http_url(checking.source, "url", url)?);
        if let Some(headers) = &self.table.headers {
            // `${VAR}` keeps a token out of the file: `Authorization = "Bearer ${A2A_TOKEN}"`.
            self.headers = http_headers(checking.source, headers.get_ref(), crate::agent::header_problem)?;
        }
        Ok(())
    }

    fn build<'a>(&'a self, building: Building<'a>) -> LocalBoxFuture<'a, Result<Arc<dyn Provider>, BuildFailure>> {
        let built = self.provider(building);
        async move { built }.boxed_local()
    }
}

impl A2a {
    #[cfg(feature = "a2a")]
    fn provider(&self, building: Building<'_>) -> Result<Arc<dyn Provider>, BuildFailure> {
        use crate::providers::{A2aConfig, A2aProvider};
        let mut config = A2aConfig::new(building.name, self.url.clone().ok_or("its url was not resolved")?);
        config.headers = self.headers.clone();
        config.skill = self.table.skill.as_ref().map(|skill| skill.get_ref().clone());
        for (key, value) in &self.durations {
            let slot = match *key {
                "connect_timeout" => &mut config.limits.connect_timeout,
                "card_timeout" => &mut config.limits.card_timeout,
                "first_event_timeout" => &mut config.limits.first_event_timeout,
                _ => &mut config.limits.idle_timeout,
            };
            *slot = *value;
        }
        A2aProvider::new(config).map(|p| Arc::new(p) as Arc<dyn Provider>).map_err(BuildFailure::from)
    }

    #[cfg(not(feature = "a2a"))]
    fn provider(&self, _: Building<'_>) -> Result<Arc<dyn Provider>, BuildFailure> {
        Err(super::FeatureOff { kind: "a2a", feature: "a2a" }.into())
    }
}
