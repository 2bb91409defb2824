//! A pipeline as it runs: each step when what it waits for has settled,
//! its prompt rendered over their results, its earlier result reused on a
//! resume; see [`pipeline`](super::super::pipeline) for the rules.
//!
//! A step's renders (its prompt, or its `for_each` list and each
//! element's prompt) run on threads of their own, a few at once
//! ([`Render`]): the loop that starts runs and writes their results never
//! waits for a template, and a cancelled batch stops waiting for its
//! renders at once (each stops at its next element; one render is bounded
//! in steps, see [`template`](super::super::template)). A step's context
//! is made once, of results converted once when they settled: each
//! element of a map adds only its `item` and `index`, so a map over a
//! wide list expands in time linear in its width.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};

use super::super::journal::hash_text;
use super::super::pipeline::{element_ids, Outcome, Pipeline, Step, DEFAULT_MAX_ITEMS};
use super::super::summary::{Graph, Summary};
use super::super::tasks::{content_hash, id_key, OnFailure, Task};
use super::super::template::{TemplateValue, Templates, STEPS_TABLE};
use super::super::{Report, Settled};
use super::Engine;
use crate::CancellationToken;

#[cfg(test)]
mod tests;

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

/// What a step renders, off the batch's loop: everything it needs, owned.
struct Render {
    templates: Arc<Templates>,
    /// The step's id, and its `key`: a map's elements' run ids.
    id: String,
    key: Option<String>,
    prompt: String,
    /// A map's list and its most elements.
    for_each: Option<(String, usize)>,
    /// The results it reads, by id and in the table of steps.
    context: TemplateValue,
    cancel: CancellationToken,
}

/// A prompt, or why it could not be made.
type Prompt = Result<String, String>;

/// What a step's render gave: its prompt; a map's element ids and
/// prompts, or why its list gave none.
enum Rendered {
    Step(Prompt),
    Map(Result<Vec<(String, Prompt)>, String>),
}

impl Render {
    fn run(self) -> Rendered {
        let Render { templates, id, key, prompt, for_each, context, cancel } = self;
        let Some((for_each, max_items)) = for_each else {
            return Rendered::Step(templates.render(&prompt, &context));
        };
        let items = match templates.list(&for_each, &context, max_items) {
            Ok(items) => items,
            Err(why) => return Rendered::Map(Err(why)),
        };
        let ids = match element_ids(&id, key.as_deref(), &items) {
            Ok(ids) => ids,
            Err(why) => return Rendered::Map(Err(why)),
        };
        let mut elements = Vec::with_capacity(items.len());
        for (index, (item, id)) in items.into_iter().zip(ids).enumerate() {
            if cancel.is_cancelled() {
                break; // no one waits for the rest
            }
            let context = minijinja::context! { item => item, index => index, ..context.clone() };
            elements.push((id, templates.render(&prompt, &context)));
        }
        Rendered::Map(Ok(elements))
    }
}

/// `render` run on a thread of its own, holding `permit` while it runs;
/// its outcome, or why it gave none. The thread is not the runtime's: an
/// interrupted batch stops waiting for it and the process ends without
/// joining it (a blocking-pool thread would hold the runtime's shutdown,
/// and so the process's exit, until its render ended).
async fn render_on_a_thread<P: Send + 'static>(render: Box<Render>, permit: P) -> Result<Rendered, String> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("subagents-render".into()).spawn(move || {
        let _permit = permit;
        let rendered = crate::contain::contained_call(|| render.run());
        let _ = sender.send(rendered.map_err(|panicked| format!("its render panicked: {panicked}")));
    });
    match spawned {
        Ok(_) => receiver.await.unwrap_or_else(|_| Err("its render ended without an answer".into())),
        Err(error) => Err(format!("no thread to render it on: {error}")),
    }
}

/// What opening a step gave: the steps it settled that are now ready, or
/// its render to run.
enum Opening {
    Settled(Vec<usize>),
    Render(Box<Render>),
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
            templates: Arc::new(templates),
            prior,
            states: steps.iter().map(|step| State::Waiting(step.waits_for.len())).collect(),
            queue: VecDeque::new(),
            summary: Summary::default(),
            report,
        };
        // A few renders at once, each on a thread of its own: they bound the
        // memory templates may hold together.
        let renders_at_once = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let renders = Arc::new(tokio::sync::Semaphore::new(renders_at_once));
        // Popped from the end: the file's first ready step starts first.
        let mut newly: Vec<usize> = (0..steps.len()).rev().filter(|&at| steps[at].waits_for.is_empty()).collect();
        let mut in_flight = FuturesUnordered::new();
        let mut rendering = FuturesUnordered::new();
        loop {
            while let Some(at) = newly.pop() {
                if self.cancel.is_cancelled() {
                    continue;
                }
                match run.open(at) {
                    Opening::Settled(ready) => newly.extend(ready.into_iter().rev()),
                    Opening::Render(render) => {
                        let renders = renders.clone();
                        rendering.push(async move {
                            let permit = renders.acquire_owned().await;
                            (at, render_on_a_thread(render, permit).await)
                        });
                    }
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
            if in_flight.is_empty() && rendering.is_empty() {
                break;
            }
            tokio::select! {
                Some((at, rendered)) = rendering.next(), if !rendering.is_empty() => {
                    let rendered = rendered.unwrap_or_else(|failed| {
                        let why = format!("its template could not be rendered: {failed}");
                        match steps[at].is_map() {
                            true => Rendered::Map(Err(why)),
                            false => Rendered::Step(Err(why)),
                        }
                    });
                    newly.extend(run.rendered(at, rendered).into_iter().rev());
                }
                Some((step, element, finished)) = in_flight.next(), if !in_flight.is_empty() => {
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
                // Its steps stay unsettled: the summary names them waiting.
                () = self.cancel.cancelled(), if !rendering.is_empty() => rendering.clear(),
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
    templates: Arc<Templates>,
    /// Result lines of an earlier batch, by id.
    prior: HashMap<String, Value>,
    states: Vec<State>,
    queue: VecDeque<Unit>,
    summary: Summary,
    report: &'a dyn Report,
}

impl PipelineRun<'_> {
    /// A step whose waits are over: skipped, or (a flat line) reused from
    /// an earlier batch or queued, settling the steps this answers that are
    /// now ready; or its render, over the results it waits for.
    fn open(&mut self, at: usize) -> Opening {
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
            return Opening::Settled(self.settle_unrun(
                at,
                None,
                step.id.clone(),
                content_hash(reason.as_bytes()),
                record,
            ));
        }
        if !step.task.is_step() {
            let prompt = Ok(step.task.prompt.clone());
            return Opening::Settled(self.queue_or_reuse(at, None, step.id.clone(), prompt, Vec::new()));
        }
        // Each result by its id, and all of them in the table of steps
        // (which names any id, `steps["fix-login"]`); shared, not copied.
        let by_id = || before.iter().map(|outcome| (outcome.id.clone(), outcome.view.clone()));
        let table = TemplateValue::from_pairs(by_id());
        let context = TemplateValue::from_pairs(by_id().chain([(STEPS_TABLE.to_owned(), table)]));
        let max_items = step.task.max_items.unwrap_or(DEFAULT_MAX_ITEMS);
        Opening::Render(Box::new(Render {
            templates: self.templates.clone(),
            id: step.id.clone(),
            key: step.task.key.clone(),
            prompt: step.task.prompt.clone(),
            for_each: step.task.for_each.clone().map(|for_each| (for_each, max_items)),
            context,
            cancel: self.engine.cancel.clone(),
        }))
    }

    /// A step's render done: its run queued (a map's: each element's), or
    /// settled when it has no prompt, or reused. Answers the steps now ready.
    fn rendered(&mut self, at: usize, rendered: Rendered) -> Vec<usize> {
        let step = &self.steps[at];
        let elements = match rendered {
            Rendered::Step(prompt) => return self.queue_or_reuse(at, None, step.id.clone(), prompt, Vec::new()),
            Rendered::Map(Err(why)) => {
                let record = json!({"line": step.line, "label": step.task.label, "error": why});
                return self.settle_unrun(at, None, step.id.clone(), content_hash(why.as_bytes()), record);
            }
            Rendered::Map(Ok(elements)) => elements,
        };
        self.report.expanded(step.line, elements.len());
        if elements.is_empty() {
            return self.settle(at, Outcome::of_map(&step.id, &[]));
        }
        self.states[at] = State::Running { elements: vec![None; elements.len()], left: elements.len() };
        let mut ready = Vec::new();
        for (index, (id, prompt)) in elements.into_iter().enumerate() {
            let extra = vec![("map", json!(self.steps[at].id)), ("index", json!(index))];
            ready.extend(self.queue_or_reuse(at, Some(index), id, prompt, extra));
        }
        ready
    }

    /// Reuses a run's earlier result when its line and inputs (its prompt)
    /// are unchanged, else queues it; a prompt that could not be made
    /// fails the run before it starts.
    fn queue_or_reuse(
        &mut self,
        at: usize,
        element: Option<usize>,
        id: String,
        prompt: Prompt,
        extra: Vec<(&'static str, Value)>,
    ) -> Vec<usize> {
        let step = &self.steps[at];
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
            outcome.view = TemplateValue::UNDEFINED; // no template reads it: not held
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
