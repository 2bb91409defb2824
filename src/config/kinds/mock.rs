//! `kind = "mock"`: scripted replies, for tests and demos.
//!
//! ```toml
//! [providers.mock]
//! kind = "mock"
//! reply = "handled: "
//! echo_prompt = true
//! delay = "20ms"
//! stop_reason = "completed"       # aborted, error, max-tokens, refusal
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
use crate::config::ConfigError;
use crate::providers::MockProvider;
use crate::seam::{Provider, StopReason};

/// The homes this file keeps.
pub(super) static HOMES: &[&Home] = &[&HOME];

static HOME: Home = Home {
    name: "mock",
    what: "a mock provider",
    keys: || fields_of::<Table>().to_vec(),
    check,
    capabilities: KindCapabilities::Fixed(MockProvider::DEFAULT_CAPABILITIES),
};

#[derive(Debug, Deserialize)]
struct Table {
    reply: Option<Spanned<String>>,
    echo_prompt: Option<Spanned<bool>>,
    delay: Option<Spanned<String>>,
    stop_reason: Option<Spanned<StopName>>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum StopName {
    Completed,
    Aborted,
    Error,
    MaxTokens,
    Refusal,
}

#[derive(Debug)]
struct Mock {
    table: Table,
    delay: Option<Duration>,
}

fn check(checking: &Checking<'_, '_>, table: Spanned<DeValue<'_>>) -> Result<Box<dyn Checked>, ConfigError> {
    let table: Table = keys::read(checking.source, table)?;
    let delay = checking.duration("delay", &table.delay)?;
    Ok(Box::new(Mock { table, delay }))
}

impl Checked for Mock {
    fn build<'a>(&'a self, building: Building<'a>) -> LocalBoxFuture<'a, Result<Arc<dyn Provider>, BuildFailure>> {
        let table = &self.table;
        let mut mock = MockProvider::new(building.name);
        if let Some(reply) = &table.reply {
            mock = mock.with_reply(reply.get_ref().clone());
        }
        if table.echo_prompt.as_ref().is_some_and(|echo| *echo.get_ref()) {
            mock = mock.with_echo_prompt();
        }
        if let Some(delay) = self.delay {
            mock = mock.with_delay(delay);
        }
        if let Some(stop) = &table.stop_reason {
            mock = mock.with_stop_reason(match stop.get_ref() {
                StopName::Completed => StopReason::Completed,
                StopName::Aborted => StopReason::Aborted,
                StopName::Error => StopReason::Error,
                StopName::MaxTokens => StopReason::MaxTokens,
                StopName::Refusal => StopReason::Refusal,
            });
        }
        let provider: Arc<dyn Provider> = Arc::new(mock);
        async move { Ok(provider) }.boxed_local()
    }
}
