//! A pipeline as it runs: each step when what it waits for has settled,
//! its prompt rendered over their results, its earlier result reused on a
//! resume; see [`pipeline`](super::super::pipeline) for the rules.

use std::collections::{HashMap, VecDeque};

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};

use super::super::journal::hash_text;
use super::super::pipeline::{element_ids, Outcome, Pipeline, Step, DEFAULT_MAX_ITEMS};
use super::super::summary::{Graph, Summary};
use super::super::tasks::{content_hash, id_key, OnFailure, Task};
use super::super::template::Templates;
use super::super::{Report, Settled};
use super::Engine;

/// Where a step is in its run.
#[derive(Debug)]
enum State {
    /// Waiting for this many steps to settle.
    Waiting(usize),
    /// Its run (or its map's runs) started; a map holds its elements'
    /// outcomes as they settle.
    Running { elements: Vec<Option<Outcome>>, left: usize },
    /// Settled: what its dependents see.
    Settled(Outcome),
}

/// One run to start: a step, or one element of a map.
struct Unit {
    step: usize,
    element: Option<usize>,
    id: String,
    task: Box<Task>,
    inputs: u64,
    extra: Vec<(&'static str, Value)>,
}

impl Engine {
    /// Runs `pipeline`: each step when what it waits for has settled, at
    /// most `concurrency` runs at once; `prior` holds the result lines a
    /// resumed batch reuses, by id.
    pub(super) async fn run_pipeline(
        &self,
        pipeline: Pipeline,
        prior: HashMap<String, Value>,
        concurrency: usize,
        report: &dyn Report,
    ) -> Summary {
        let Pipeline { steps, templates, .. } = pipeline;
        let steps: &[Step] = &steps;
        let mut run = PipelineRun {
            engine: self,
            steps,
            templates: &templates,
            prior,
            states: steps.iter().map(|step| State::Waiting(step.waits_for.len())).collect(),
            queue: VecDeque::new(),
            summary: Summary::default(),
            report,
        };
        // Popped from the end: the file's first ready step starts first.
        let mut newly: Vec<usize> = (0..steps.len()).rev().filter(|&at| steps[at].waits_for.is_empty()).collect();
        let mut in_flight = FuturesUnordered::new();
        loop {
            while let Some(at) = newly.pop() {
                if !self.cancel.is_cancelled() {
                    newly.extend(run.open(at).into_iter().rev());
                }
            }
            while in_flight.len() < concurrency && !self.cancel.is_cancelled() {
                let Some(unit) = run.queue.pop_front() else { break };
                let Unit { step, element, id, task, inputs, extra } = unit;
                let hash = steps[step].hash;
                in_flight.push(async move {
                    let finished = self.run_one(steps[step].line, task, id, hash, Some(inputs), extra, report).await;
                    (step, element, finished)
                });
            }
            let Some((step, element, finished)) = in_flight.next().await else { break };
            let Some((finished, record)) = finished else {
                run.summary.unstarted += 1;
                continue;
            };
            let interrupted = finished.interrupted;
            run.summary.add(finished);
            if !interrupted {
                newly.extend(run.settle_run(step, element, &record).into_iter().rev());
            }
        }
        let waiting = run.waiting();
        let mut summary = run.summary;
        summary.pipeline =
            Some(Graph { steps: steps.len(), maps: steps.iter().filter(|step| step.is_map()).count(), waiting });
        summary
    }
}

/// A pipeline as it runs: the steps' states and the runs ready to start.
struct PipelineRun<'a> {
    engine: &'a Engine,
    steps: &'a [Step],
    templates: &'a Templates,
    /// Result lines of an earlier batch, by id.
    prior: HashMap<String, Value>,
    states: Vec<State>,
    queue: VecDeque<Unit>,
    summary: Summary,
    report: &'a dyn Report,
}

impl PipelineRun<'_> {
    /// A step whose waits are over: skipped, failed before any run, reused
    /// from an earlier batch, or queued (a map: its elements). Answers the
    /// steps this settled that are now ready.
    fn open(&mut self, at: usize) -> Vec<usize> {
        let step = &self.steps[at];
        let before: Vec<&Outcome> = step
            .waits_for
            .iter()
            .filter_map(|&before| match &self.states[before] {
                State::Settled(outcome) => Some(outcome),
                _ => None,
            })
            .collect();
        let failed = before.iter().find(|outcome| !outcome.completed);
        if let (Some(failed), OnFailure::Skip) = (failed, step.task.on_failure) {
            let reason = failed.skip_reason();
            let record = json!({"line": step.line, "label": step.task.label, "skipped": reason});
            return self.settle_unrun(at, None, step.id.clone(), content_hash(reason.as_bytes()), record);
        }
        let mut context = serde_json::Map::new();
        for outcome in &before {
            context.insert(outcome.id.clone(), outcome.view.clone());
        }
        let mut context = Value::Object(context);
        let Some(for_each) = &step.task.for_each else {
            return self.queue_or_reuse(at, None, step.id.clone(), &context, Vec::new());
        };
        let max = step.task.max_items.unwrap_or(DEFAULT_MAX_ITEMS);
        let items = self.templates.list(for_each, &context).and_then(|items| match items.len() <= max {
            true => Ok(items),
            false => Err(format!("for_each gave {} elements, more than its max_items of {max}", items.len())),
        });
        let items = match items.and_then(|items| element_ids(step, &items).map(|ids| (items, ids))) {
            Ok(both) => both,
            Err(why) => {
                let record = json!({"line": step.line, "label": step.task.label, "error": why});
                return self.settle_unrun(at, None, step.id.clone(), content_hash(why.as_bytes()), record);
            }
        };
        let (items, ids) = items;
        if items.is_empty() {
            self.report.expanded(step.line, 0);
            return self.settle(at, Outcome::of_map(&step.id, &[]));
        }
        self.report.expanded(step.line, items.len());
        self.states[at] = State::Running { elements: vec![None; items.len()], left: items.len() };
        let mut ready = Vec::new();
        for (index, (item, id)) in items.into_iter().zip(ids).enumerate() {
            context["item"] = item.clone();
            context["index"] = json!(index);
            let extra = vec![("map", json!(step.id)), ("index", json!(index))];
            ready.extend(self.queue_or_reuse(at, Some(index), id, &context, extra));
        }
        ready
    }

    /// Renders a run's prompt and reuses its earlier result when its line
    /// and inputs are unchanged, else queues it; a prompt that cannot
    /// render fails the run before it starts.
    fn queue_or_reuse(
        &mut self,
        at: usize,
        element: Option<usize>,
        id: String,
        context: &Value,
        extra: Vec<(&'static str, Value)>,
    ) -> Vec<usize> {
        let step = &self.steps[at];
        let prompt = match step.task.is_step() {
            true => self.templates.render(&step.task.prompt, context),
            false => Ok(step.task.prompt.clone()),
        };
        let prompt = match prompt {
            Ok(prompt) => prompt,
            Err(why) => {
                let why = format!("its prompt could not be made: {why}");
                let mut record = json!({"line": step.line, "label": step.task.label, "error": why});
                for (key, value) in extra {
                    record[key] = value;
                }
                return self.settle_unrun(at, element, id, content_hash(why.as_bytes()), record);
            }
        };
        let inputs = content_hash(prompt.as_bytes());
        if let Some(record) = self.reusable(step, &id, inputs) {
            self.summary.already_done += 1;
            self.report.done_before();
            return self.settle_run(at, element, &record);
        }
        let mut task = step.task.clone();
        task.prompt = prompt;
        if element.is_some() {
            // An element's run is named by its own id wherever it is shown.
            task.label = Some(match &task.label {
                Some(label) => format!("{label} {id}"),
                None => id.clone(),
            });
        }
        self.queue.push_back(Unit { step: at, element, id, task, inputs, extra });
        Vec::new()
    }

    /// The earlier result of `id`, when a resume may keep it: written for
    /// this line and (a step's) these inputs, and complete unless
    /// `--rerun-failed`. A flat line's prompt is its line: a result a flat
    /// batch wrote for it is kept too.
    fn reusable(&self, step: &Step, id: &str, inputs: u64) -> Option<Value> {
        let record = self.prior.get(id)?;
        let prior = self.engine.settled.get(&id_key(id))?;
        let same_inputs = !step.task.is_step() || record["inputs_hash"] == hash_text(inputs).as_str();
        let same = prior.hash == Some(step.hash) && same_inputs;
        (same && (prior.completed || !self.engine.resume.rerun_failed)).then(|| record.clone())
    }

    /// A run that will not start (skipped, or its prompt or list could not
    /// be made): its result line written (or the earlier batch's reused),
    /// then settled.
    fn settle_unrun(
        &mut self,
        at: usize,
        element: Option<usize>,
        id: String,
        inputs: u64,
        mut record: Value,
    ) -> Vec<usize> {
        let step = &self.steps[at];
        if let Some(earlier) = self.reusable(step, &id, inputs) {
            self.summary.already_done += 1;
            self.report.done_before();
            return self.settle_run(at, element, &earlier);
        }
        record["id"] = json!(id);
        record["task_hash"] = json!(hash_text(step.hash));
        record["inputs_hash"] = json!(hash_text(inputs));
        let written = self.engine.results.write(&record, self.report);
        let outcome = if record.get("skipped").is_some() { "skipped" } else { "error" };
        let detail = record.get("skipped").or_else(|| record.get("error")).and_then(Value::as_str);
        self.report.settled(&Settled {
            line: step.line,
            label: step.task.label.as_deref(),
            outcome,
            detail,
            latency: std::time::Duration::ZERO,
            record: &record,
            written,
        });
        self.summary.add_unrun(outcome, written);
        if !written {
            return Vec::new(); // results are lost: the batch stops
        }
        self.settle_run(at, element, &record)
    }

    /// A run's result: the step settles (a map when its last element
    /// has). Answers the steps now ready.
    fn settle_run(&mut self, at: usize, element: Option<usize>, record: &Value) -> Vec<usize> {
        let mut outcome = Outcome::of(record);
        if self.steps[at].dependents.is_empty() {
            outcome.view = Value::Null; // no template reads it: not held
        }
        let Some(index) = element else { return self.settle(at, outcome) };
        let State::Running { elements, left } = &mut self.states[at] else { return Vec::new() };
        if elements[index].replace(outcome).is_none() {
            *left -= 1;
        }
        if *left > 0 {
            return Vec::new();
        }
        let elements: Vec<Outcome> = elements.iter_mut().filter_map(Option::take).collect();
        let outcome = Outcome::of_map(&self.steps[at].id, &elements);
        self.settle(at, outcome)
    }

    fn settle(&mut self, at: usize, outcome: Outcome) -> Vec<usize> {
        self.states[at] = State::Settled(outcome);
        let mut ready = Vec::new();
        for &dependent in &self.steps[at].dependents {
            if let State::Waiting(left) = &mut self.states[dependent] {
                *left -= 1;
                if *left == 0 {
                    ready.push(dependent);
                }
            }
        }
        ready
    }

    /// The steps that did not settle, each with the ids it still waits for.
    fn waiting(&self) -> Vec<(usize, String, Vec<String>)> {
        let unsettled = |at: usize| !matches!(self.states[at], State::Settled(_));
        (0..self.steps.len())
            .filter(|&at| unsettled(at))
            .map(|at| {
                let step = &self.steps[at];
                let on = step.waits_for.iter().filter(|&&before| unsettled(before));
                (step.line, step.id.clone(), on.map(|&before| self.steps[before].id.clone()).collect())
            })
            .collect()
    }
}
