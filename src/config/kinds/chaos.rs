//! `kind = "chaos"`: seeded faults around another provider of the file.
//!
//! ```toml
//! [providers.flaky]
//! kind = "chaos"
//! wraps = "cheap"
//! seed = 7
//! faults = [{ stage = "run", fault = "error", probability = 0.2 }]
//! ```

use std::sync::Arc;

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use serde::Deserialize;
use toml::de::DeValue;
use toml::Spanned;

use super::{BuildFailure, Building, Checked, Checking, Home, KindCapabilities};
use crate::config::keys::{self, fields_of, TableKeys};
use crate::config::{parse_duration, ConfigError};
use crate::providers::{ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage};
use crate::seam::Provider;

/// The homes this file keeps.
pub(super) static HOMES: &[&Home] = &[&HOME];

static HOME: Home = Home {
    name: "chaos",
    what: "a chaos provider",
    keys: || fields_of::<Table>().to_vec(),
    check,
    capabilities: KindCapabilities::Wrapped,
};

#[derive(Debug, Deserialize)]
struct Table {
    wraps: Option<Spanned<String>>,
    seed: Option<Spanned<u64>>,
    /// Each read as a [`FaultTable`] once its keys are checked (here for
    /// its key and its shape).
    #[allow(dead_code)]
    faults: Option<Spanned<Vec<Spanned<toml::Value>>>>,
}

/// One rule: `{ stage = "run", fault = "error", probability = 0.2 }`.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a table such as { stage = \"run\", fault = \"error\", probability = 0.2 }")]
struct FaultTable {
    stage: StageName,
    fault: String,
    probability: f64,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StageName {
    Launch,
    Run,
    Dispose,
    Progress,
}

#[derive(Debug)]
struct Chaos {
    wraps: Spanned<String>,
    seed: u64,
    schedule: Vec<(ChaosStage, ChaosFault, f64)>,
}

fn check(checking: &Checking<'_, '_>, table: Spanned<DeValue<'_>>) -> Result<Box<dyn Checked>, ConfigError> {
    let source = checking.source;
    let faults: Vec<Spanned<DeValue<'_>>> = match table.get_ref().get("faults").map(|f| f.get_ref()) {
        Some(DeValue::Array(faults)) => faults.iter().cloned().collect(),
        _ => Vec::new(),
    };
    let table: Table = keys::read(source, table)?;
    let fault_keys = TableKeys { what: "a fault", place: "a fault", keys: fields_of::<FaultTable>().to_vec() };
    let mut schedule = Vec::new();
    for fault in faults {
        keys::check(source, &fault, &fault_keys, &[])?;
        let span = fault.span();
        let rule: FaultTable = keys::read(source, fault)?;
        schedule.push(chaos_rule(&rule).map_err(|e| source.error(Some(span), e))?);
    }
    let Some(wraps) = table.wraps else { return Err(checking.needs("chaos", "`wraps`")) };
    Ok(Box::new(Chaos { wraps, seed: table.seed.map_or(0, Spanned::into_inner), schedule }))
}

fn chaos_rule(fault: &FaultTable) -> Result<(ChaosStage, ChaosFault, f64), String> {
    let stage = match fault.stage {
        StageName::Launch => ChaosStage::Launch,
        StageName::Run => ChaosStage::Run,
        StageName::Dispose => ChaosStage::Dispose,
        StageName::Progress => ChaosStage::Progress,
    };
    let injected = match fault.fault.as_str() {
        "error" => ChaosFault::Error,
        "hang" => ChaosFault::Hang,
        "panic" => ChaosFault::Panic,
        "crash" => ChaosFault::Crash,
        "drop_progress" => ChaosFault::DropProgress,
        "duplicate_progress" => ChaosFault::DuplicateProgress,
        other => match other.strip_prefix("delay:") {
            Some(duration) => ChaosFault::Delay(parse_duration(duration).map_err(|e| e.to_string())?),
            None => {
                return Err(format!(
                    "unknown fault {other:?}: error, hang, panic, crash, drop_progress, duplicate_progress or delay:DURATION"
                ))
            }
        },
    };
    if !(0.0..=1.0).contains(&fault.probability) {
        return Err(format!("probability {} is not between 0 and 1", fault.probability));
    }
    Ok((stage, injected, fault.probability))
}

impl Checked for Chaos {
    fn wraps(&self) -> Option<&Spanned<String>> {
        Some(&self.wraps)
    }

    fn build<'a>(&'a self, building: Building<'a>) -> LocalBoxFuture<'a, Result<Arc<dyn Provider>, BuildFailure>> {
        let built = building.wrapped.ok_or_else(|| BuildFailure::from("the wrapped provider was not built")).map(|inner| {
            let schedule = self
                .schedule
                .iter()
                .fold(ChaosSchedule::new(), |schedule, (stage, fault, p)| schedule.rule(*stage, *fault, *p));
            Arc::new(ChaosProvider::wrap(building.name.to_owned(), inner, schedule, self.seed)) as Arc<dyn Provider>
        });
        async move { built }.boxed_local()
    }
}
