//! What a batch keeps about its finished runs, and the summary it prints
//! from that.
//!
//! A batch may run millions of tasks, so nothing here grows with them: a
//! [`Summary`] holds a count per outcome (a handful of stop reasons and error
//! codes) and a [`Latencies`] histogram of fixed size. p50 and p99 come from
//! the histogram to within about 3 %, which is all a summary line needs.
//!
//! ```text
//! 200000 runs in 7.04s (28399 runs/s)
//!   stop reason                runs
//!   completed                200000
//!   latency p50 29.4ms, p99 98.2ms
//!   tokens 5200000 (input 4000000, output 1200000, cache read 0, cache write 0)
//!   model calls 200000, attempts 200000, waited on rate limits 0.0s
//!   route "fast": 200000 requests, 0 answered 429/529 (0 without advice), waited 0.0s, concurrency 256 of 256
//! ```
//!
//! The token and call figures are every task run's tree together (each
//! result line's `tree_usage`).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use crate::seam::RunUsage;

/// One finished run, as the batch counts it.
pub(super) struct Finished {
    pub(super) latency: Duration,
    /// Whether it stopped `completed`.
    pub(super) completed: bool,
    /// Whether its transport could not serve it (a remote run whose
    /// workers were lost, whose caller lost its lease, or whose broker or
    /// pool did not answer): the task did not really run.
    pub(super) unserved: bool,
    /// The stop reason, `error`, or `rejected (CODE)`: the summary's rows.
    pub(super) outcome: String,
    /// Runs under it that an interruption stopped (from its receipt).
    pub(super) stopped_descendants: usize,
    /// Branches of its receipt that could not be known.
    pub(super) unknown_branches: usize,
    /// Whether it ran more than once (`--retry`).
    pub(super) retried: bool,
    /// Whether it was a run of an earlier batch, attached to again.
    pub(super) reattached: bool,
    /// What its tree spent on models.
    pub(super) usage: RunUsage,
    /// Whether the batch's interruption stopped it: its line says
    /// `"interrupted": true` and `--resume` runs it again.
    pub(super) interrupted: bool,
    /// Whether its result line was written.
    pub(super) written: bool,
}

/// Counts per outcome and a latency histogram of every finished run, plus
/// the task lines that never became runs, and how the batch ended.
#[derive(Debug, Default)]
pub struct Summary {
    per_outcome: BTreeMap<String, usize>,
    latencies: Latencies,
    runs: usize,
    incomplete: usize,
    unserved: usize,
    /// Task lines skipped as malformed.
    pub(super) skipped: usize,
    /// Tasks an earlier batch settled (a resume), not run again.
    pub(super) already_done: usize,
    /// Runs that took more than one attempt.
    retried: usize,
    reattached: usize,
    /// The tasks file failed before its end.
    pub(super) unread: bool,
    /// The batch stopped taking lines before the tasks file's end (its
    /// token was cancelled, or results were lost): what was left did not run.
    pub(super) stopped_reading: bool,
    /// Tasks taken from the file that the batch stopped before their run.
    pub(super) unstarted: usize,
    /// Runs under the batch's runs that an interruption stopped.
    stopped_descendants: usize,
    /// Receipt branches that could not be known.
    unknown_branches: usize,
    /// What every run's tree spent on models.
    usage: RunUsage,
    interrupted: usize,
    unwritten: usize,
    elapsed: Duration,
    /// The batch's token was cancelled (and not by a lost result).
    was_interrupted: bool,
    /// Why results could no longer be written.
    lost: Option<String>,
    resumable: bool,
    /// A pipeline's graph, when the batch was one.
    pub(super) pipeline: Option<Graph>,
    /// Pipeline steps settled without a run (skipped after a failure, or
    /// a prompt or list that could not be made).
    unrun: usize,
    /// Each model route's limiter as the batch ended ([`Summary::with_routes`]).
    routes: Vec<(String, crate::agent::RouteStats)>,
}

/// A pipeline's steps as the batch ended.
#[derive(Debug, Default)]
pub(super) struct Graph {
    /// Its steps (task lines).
    pub(super) steps: usize,
    /// Of them, `for_each` maps.
    pub(super) maps: usize,
    /// The steps that did not settle: line, id, and the ids each still
    /// waits for.
    pub(super) waiting: Vec<(usize, String, Vec<String>)>,
}

/// Waiting steps named one by one in the summary; past this, counted.
const NAMED_WAITING: usize = 10;

impl Summary {
    /// A pipeline step settled without a run, with `outcome` (`skipped`,
    /// `error`).
    pub(super) fn add_unrun(&mut self, outcome: &str, written: bool) {
        self.unrun += 1;
        self.incomplete += 1;
        self.unwritten += usize::from(!written);
        *self.per_outcome.entry(outcome.to_owned()).or_default() += 1;
    }

    /// A pipeline's steps that did not settle (an interrupted or stopped
    /// batch), each with its line, id and the ids it still waits for.
    pub fn waiting_steps(&self) -> impl Iterator<Item = (usize, &str, &[String])> {
        self.pipeline.iter().flat_map(|graph| graph.waiting.iter()).map(|(line, id, on)| (*line, id.as_str(), &on[..]))
    }

    pub(super) fn add(&mut self, settled: Finished) {
        self.runs += 1;
        self.incomplete += usize::from(!settled.completed);
        self.unserved += usize::from(settled.unserved);
        self.retried += usize::from(settled.retried);
        self.reattached += usize::from(settled.reattached);
        self.latencies.record(settled.latency);
        *self.per_outcome.entry(settled.outcome).or_default() += 1;
        self.stopped_descendants += settled.stopped_descendants;
        self.unknown_branches += settled.unknown_branches;
        self.usage += settled.usage;
        self.interrupted += usize::from(settled.interrupted);
        self.unwritten += usize::from(!settled.written);
    }

    /// How the batch ended: after `elapsed`, its token `cancelled`,
    /// results `lost`, from a place a resume can read.
    pub(super) fn close(&mut self, elapsed: Duration, cancelled: bool, lost: Option<String>, resumable: bool) {
        self.elapsed = elapsed;
        self.was_interrupted = cancelled && lost.is_none();
        self.lost = lost;
        self.resumable = resumable;
    }

    /// Runs the batch's interruption stopped (not settled: a resume runs
    /// them again).
    pub fn interrupted_runs(&self) -> usize {
        self.interrupted
    }

    /// Whether the batch's token cancelled it.
    pub fn was_interrupted(&self) -> bool {
        self.was_interrupted
    }

    /// Why results could no longer be written, when that stopped the batch.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// Whether a resume can finish the batch (its results file is a
    /// regular file).
    pub fn resumable(&self) -> bool {
        self.resumable
    }

    /// Runs under the batch's runs that an interruption stopped.
    pub fn stopped_descendants(&self) -> usize {
        self.stopped_descendants
    }

    /// Receipt branches that could not be known.
    pub fn unknown_branches(&self) -> usize {
        self.unknown_branches
    }

    /// Runs carried out, all attempts of a task counting once.
    pub fn runs(&self) -> usize {
        self.runs
    }

    /// Runs per outcome: stop reasons, `error`, `rejected (CODE)`,
    /// `interrupted`.
    pub fn outcomes(&self) -> impl Iterator<Item = (&str, usize)> {
        self.per_outcome.iter().map(|(outcome, count)| (outcome.as_str(), *count))
    }

    /// Task lines skipped (malformed, or a repeated id).
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Tasks an earlier batch settled, not run again.
    pub fn done_before(&self) -> usize {
        self.already_done
    }

    /// What every run's tree spent on models.
    pub fn usage(&self) -> &RunUsage {
        &self.usage
    }

    /// The latency below which a share `p` of the runs fall (within 3 %).
    pub fn latency_quantile(&self, p: f64) -> Duration {
        self.latencies.quantile(p)
    }

    /// From the first run to the last settled.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Every task line of the file was read and became a run that its
    /// provider served and that settled: false after an interruption that
    /// left a task unstarted or stopped one (a resume runs them), and
    /// while a pipeline's step still waits.
    pub fn all_ran(&self) -> bool {
        let settled_every_task = !self.stopped_reading && self.unstarted == 0 && self.interrupted == 0;
        let no_step_waits = self.waiting_steps().next().is_none();
        self.skipped == 0
            && !self.unread
            && self.unserved == 0
            && self.unwritten == 0
            && settled_every_task
            && no_step_waits
    }

    /// Every run completed (stop reason `completed`).
    pub fn all_completed(&self) -> bool {
        self.incomplete == 0
    }

    /// Adds what each model route's limiter saw (`Limiter::stats`, taken
    /// as the batch ended): a line each for the routes that were called.
    pub fn with_routes(mut self, routes: impl IntoIterator<Item = (String, crate::agent::RouteStats)>) -> Self {
        self.routes = routes.into_iter().filter(|(_, stats)| stats.requests > 0).collect();
        self
    }

    /// Writes the summary for a person (the outcomes are the library's own
    /// words: nothing here came from a child).
    pub fn write_to(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let elapsed = self.elapsed;
        let rate = self.runs as f64 / elapsed.as_secs_f64().max(1e-9);
        writeln!(out, "\n{} runs in {:.2?} ({rate:.0} runs/s)", self.runs, elapsed)?;
        writeln!(out, "  {:<24} {:>6}", "stop reason", "runs")?;
        for (outcome, count) in &self.per_outcome {
            writeln!(out, "  {outcome:<24} {count:>6}")?;
        }
        if self.unrun > 0 {
            writeln!(out, "  {:<24} {:>6}", "(steps not run)", self.unrun)?;
        }
        if self.skipped > 0 {
            writeln!(out, "  {:<24} {:>6}", "(skipped lines)", self.skipped)?;
        }
        if self.unserved > 0 {
            writeln!(out, "  {:<24} {:>6}", "(not served)", self.unserved)?;
        }
        if self.unwritten > 0 {
            writeln!(out, "  {:<24} {:>6}", "(result not written)", self.unwritten)?;
        }
        if self.already_done > 0 {
            writeln!(out, "  {:<24} {:>6}", "(done before, skipped)", self.already_done)?;
        }
        if self.reattached > 0 {
            writeln!(out, "  {:<24} {:>6}", "(attached again)", self.reattached)?;
        }
        if self.retried > 0 {
            writeln!(out, "  {:<24} {:>6}", "(retried)", self.retried)?;
        }
        if let Some(graph) = &self.pipeline {
            let settled = graph.steps - graph.waiting.len();
            writeln!(
                out,
                "  pipeline: {} steps ({} for_each), {settled} settled, {} waiting",
                graph.steps,
                graph.maps,
                graph.waiting.len()
            )?;
            for (line, id, on) in graph.waiting.iter().take(NAMED_WAITING) {
                match on.is_empty() {
                    true => writeln!(out, "    line {line}: {id:?} did not finish")?,
                    false => writeln!(out, "    line {line}: {id:?} waits for {}", quoted(on))?,
                }
            }
            if graph.waiting.len() > NAMED_WAITING {
                writeln!(out, "    and {} more steps", graph.waiting.len() - NAMED_WAITING)?;
            }
        }
        let (p50, p99) = (self.latencies.quantile(0.5), self.latencies.quantile(0.99));
        writeln!(out, "  latency p50 {p50:.1?}, p99 {p99:.1?}")?;
        let usage = &self.usage;
        writeln!(
            out,
            "  tokens {} (input {}, output {}, cache read {}, cache write {})",
            usage.tokens(),
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens
        )?;
        let waited = Duration::from_millis(usage.limit_wait_ms);
        writeln!(
            out,
            "  model calls {}, attempts {}, waited on rate limits {:.1}s (all calls together)",
            usage.model_calls,
            usage.attempts,
            waited.as_secs_f64()
        )?;
        for (name, stats) in &self.routes {
            write!(
                out,
                "  route {name:?}: {} requests, {} answered 429/529 ({} without advice), waited {:.1}s, \
                 concurrency {} of {}",
                stats.requests,
                stats.refused,
                stats.refused_unexplained,
                stats.waited.as_secs_f64(),
                stats.concurrency,
                stats.concurrency_cap
            )?;
            if let Some(shared) = &stats.shared {
                write!(out, ", shared by {} processes", shared.members)?;
                if shared.fallback.is_some() {
                    write!(out, " (on its own fraction now: the broker is out of reach)")?;
                }
            }
            writeln!(out)?;
        }
        Ok(())
    }
}

/// Ids quoted and listed, at most [`NAMED_WAITING`] of them.
fn quoted(ids: &[String]) -> String {
    let mut listed: Vec<String> = ids.iter().take(NAMED_WAITING).map(|id| format!("{id:?}")).collect();
    if ids.len() > NAMED_WAITING {
        listed.push(format!("{} more", ids.len() - NAMED_WAITING));
    }
    listed.join(", ")
}

/// Sub-buckets per power of two: the relative error is at most 1/32.
const SUB_BITS: u32 = 5;
const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// Exact buckets below 32 µs, then 32 per power of two up to 2^64 µs.
const BUCKETS: usize = SUB_BUCKETS * (64 - SUB_BITS as usize + 1);

/// A log-linear histogram of latencies in microseconds (15 KiB, whatever
/// the number of runs).
#[derive(Debug)]
pub(super) struct Latencies {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies { counts: Box::new([0; BUCKETS]), total: 0 }
    }
}

impl Latencies {
    pub(super) fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket_of(micros)] += 1;
        self.total += 1;
    }

    /// The latency below which a share `p` of the runs fall (the middle of
    /// its bucket); zero when nothing was recorded.
    pub(super) fn quantile(&self, p: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        // The same rank a sorted list would give: index round((n - 1) p).
        let rank = ((self.total - 1) as f64 * p.clamp(0.0, 1.0)).round() as u64;
        let mut seen = 0;
        for (bucket, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen > rank {
                let (low, high) = bounds_of(bucket);
                return Duration::from_micros(low + (high - low) / 2);
            }
        }
        Duration::ZERO
    }
}

/// Values below 32 have a bucket each; above, a value's bucket is its power
/// of two and the 5 bits after its leading one.
fn bucket_of(micros: u64) -> usize {
    if micros < SUB_BUCKETS as u64 {
        return micros as usize;
    }
    let magnitude = 63 - micros.leading_zeros(); // ≥ SUB_BITS
    let shift = magnitude - SUB_BITS;
    let sub = ((micros >> shift) as usize) & (SUB_BUCKETS - 1);
    (shift as usize + 1) * SUB_BUCKETS + sub
}

/// The values `[low, high]` a bucket holds.
fn bounds_of(bucket: usize) -> (u64, u64) {
    if bucket < SUB_BUCKETS {
        return (bucket as u64, bucket as u64);
    }
    let shift = (bucket / SUB_BUCKETS - 1) as u32;
    let sub = (bucket % SUB_BUCKETS) as u64;
    let low = (SUB_BUCKETS as u64 + sub) << shift;
    (low, low + ((1u64 << shift) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lands_in_a_bucket_that_holds_it() {
        for micros in (0..5000).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let (low, high) = bounds_of(bucket_of(micros));
            assert!(low <= micros && micros <= high, "{micros} in [{low}, {high}]");
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_three_percent_of_a_sorted_list() {
        let mut histogram = Latencies::default();
        let samples: Vec<u64> = (1..=10_000u64).map(|n| n * n % 250_000 + 100).collect();
        for &micros in &samples {
            histogram.record(Duration::from_micros(micros));
        }
        let mut sorted = samples.clone();
        sorted.sort_unstable();
        for p in [0.0, 0.5, 0.9, 0.99, 1.0] {
            let exact = sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64;
            let estimate = histogram.quantile(p).as_micros() as f64;
            assert!((estimate - exact).abs() <= exact * 0.032, "p{p}: {estimate} vs {exact}");
        }
    }

    #[test]
    fn an_empty_histogram_reports_zero() {
        assert_eq!(Latencies::default().quantile(0.99), Duration::ZERO);
    }
}
