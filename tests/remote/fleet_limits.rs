//! One rate limit for the whole fleet: real `subagents worker` processes
//! whose configuration marks a route `shared = true`, a real broker, and a
//! loopback stand-in model server that admits a fixed rate (a GCRA bucket,
//! as providers keep one, with a quarter second of burst: 429 with
//! `retry-after` beyond) and logs every request it received, refused or
//! not, with the calls in flight at its arrival. The burst absorbs
//! the jitter between a worker's admission and the request's arrival on a
//! loaded machine, not a fleet that keeps to four times the rate.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use serde_json::Value;
use subagents::StopReason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::support::{broker, caller, Worker, LEASE_TTL_MS};
use crate::common::{request, Within, WAIT_LIMIT};

/// How the stand-in answers.
#[derive(Clone, Copy)]
enum Policy {
    /// Admits `per_second` with a burst of a quarter second's worth (a GCRA
    /// bucket); 429 with `retry-after: 1` beyond.
    Rate { per_second: f64 },
    /// Admits everything, each answer after `delay`.
    Slow { delay: Duration },
}

/// The stand-in's counts, and every request it received: when, how many
/// were in flight with it, and its status.
struct StandIn {
    policy: Policy,
    answered: AtomicUsize,
    refused: AtomicUsize,
    in_flight: AtomicUsize,
    /// Requests still to refuse with a bare 429 (no header says when to
    /// come back), armed by the test.
    bare_refusals: AtomicUsize,
    /// Requests still to refuse with a 429 whose `retry-after: 2` says
    /// when to come back, armed by the test (before any bare refusal).
    advised_refusals: AtomicUsize,
    log: Mutex<Vec<(Instant, usize, u16)>>,
    /// Arrival of the first and the last admitted request.
    span: Mutex<Option<(Instant, Instant)>>,
    /// GCRA's theoretical arrival time.
    bucket: Mutex<Option<Instant>>,
}

impl StandIn {
    /// Serves `policy` on a thread of its own; its base URL.
    fn start(policy: Policy) -> (Arc<StandIn>, String) {
        let stand_in = Arc::new(StandIn {
            policy,
            answered: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            bare_refusals: AtomicUsize::new(0),
            advised_refusals: AtomicUsize::new(0),
            log: Mutex::default(),
            span: Mutex::default(),
            bucket: Mutex::default(),
        });
        let (started, url) = std::sync::mpsc::channel();
        let serving = stand_in.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let _ = started.send(format!("http://{}/v1", listener.local_addr().unwrap()));
                while let Ok((socket, _)) = listener.accept().await {
                    tokio::spawn(serving.clone().connection(socket));
                }
            });
        });
        (stand_in, url.recv_timeout(WAIT_LIMIT).unwrap())
    }

    /// Whether a request arriving now is admitted, else the status line
    /// (and headers) of its refusal; logged either way.
    fn admit(&self, in_flight: usize) -> Result<(), &'static str> {
        let now = Instant::now();
        let take =
            |count: &AtomicUsize| count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        let refusal = match self.policy {
            Policy::Rate { per_second } => {
                let spacing = Duration::from_secs_f64(1.0 / per_second);
                let mut bucket = self.bucket.lock().unwrap();
                let due = bucket.unwrap_or(now);
                let admitted = due.saturating_duration_since(now) <= Duration::from_millis(250);
                if admitted {
                    *bucket = Some(due.max(now) + spacing);
                }
                (!admitted).then_some("429 Too Many Requests\r\nretry-after: 1")
            }
            Policy::Slow { .. } if take(&self.advised_refusals) => Some("429 Too Many Requests\r\nretry-after: 2"),
            Policy::Slow { .. } => take(&self.bare_refusals).then_some("429 Too Many Requests"),
        };
        let admitted = refusal.is_none();
        if admitted {
            let mut span = self.span.lock().unwrap();
            *span = Some(span.map_or((now, now), |(first, _)| (first, now)));
        }
        self.log.lock().unwrap().push((now, in_flight, if admitted { 200 } else { 429 }));
        refusal.map_or(Ok(()), Err)
    }

    async fn connection(self: Arc<Self>, mut socket: tokio::net::TcpStream) {
        let mut buffer = Vec::new();
        loop {
            let head_end = loop {
                if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end + 4;
                }
                let mut chunk = [0u8; 8192];
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => buffer.extend_from_slice(&chunk[..read]),
                }
            };
            let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0);
            while buffer.len() < head_end + length {
                let mut chunk = [0u8; 8192];
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => buffer.extend_from_slice(&chunk[..read]),
                }
            }
            buffer.drain(..head_end + length);
            let in_flight = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            let (status, body) = if let Err(status) = self.admit(in_flight) {
                self.refused.fetch_add(1, Ordering::Relaxed);
                (status, r#"{"error":{"message":"rate limited"}}"#)
            } else {
                if let Policy::Slow { delay } = self.policy {
                    tokio::time::sleep(delay).await;
                }
                self.answered.fetch_add(1, Ordering::Relaxed);
                (
                    "200 OK",
                    r#"{"choices":[{"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#,
                )
            };
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if socket.write_all(response.as_bytes()).await.is_err() {
                return;
            }
        }
    }

    /// Admitted requests a second, from the first to the last.
    fn rate(&self) -> f64 {
        let (first, last) = self.span.lock().unwrap().expect("requests came");
        let answered = self.answered.load(Ordering::Relaxed);
        (answered.saturating_sub(1)) as f64 / (last - first).as_secs_f64()
    }

    /// Requests received a second (admitted or refused), from the first to
    /// the last, and the most received in any one second.
    fn received(&self) -> (f64, usize) {
        let log = self.log.lock().unwrap();
        let (first, last) = (log.first().expect("requests came").0, log.last().unwrap().0);
        let rate = (log.len().saturating_sub(1)) as f64 / (last - first).as_secs_f64();
        let mut most = 0;
        let mut from = 0;
        for (to, (at, _, _)) in log.iter().enumerate() {
            while *at - log[from].0 >= Duration::from_secs(1) {
                from += 1;
            }
            most = most.max(to + 1 - from);
        }
        (rate, most)
    }
}

/// A worker configuration whose `spawn` provider runs on route `fleet`.
fn worker_config(dir: &Path, url: &str, limits: &str) -> String {
    let file = dir.join("worker.toml");
    let text = format!(
        "[models.fleet]\napi = \"openai-chat\"\nbase_url = \"{url}\"\nmodel = \"stand-in\"\n{limits}\nshared = true\n\n\
         [providers.spawn]\nkind = \"spawn\"\nmodel = \"fleet\"\n"
    );
    std::fs::write(&file, text).unwrap();
    file.display().to_string()
}

/// `count` remote runs, at most `concurrency` at once; how many completed.
fn run_all(runtime: &subagents::Runtime, count: usize, concurrency: usize) -> usize {
    let subagents = runtime.subagents();
    runtime.within(WAIT_LIMIT, "every remote run to settle", async move {
        stream::iter(0..count)
            .map(|n| {
                let subagents = subagents.clone();
                async move {
                    let run = subagents.start("remote", request(&format!("task {n}"))).await.unwrap();
                    let result = run.result().await.unwrap();
                    run.dispose().await.unwrap();
                    result.stop_reason == StopReason::Completed
                }
            })
            .buffer_unordered(concurrency)
            .filter(|completed| std::future::ready(*completed))
            .count()
            .await
    })
}

/// The route's record in the limits bucket.
fn record(url: &str) -> Option<Value> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = async_nats::connect(url).await.ok()?;
        let jetstream = async_nats::jetstream::new(client);
        let limits = jetstream.get_key_value("subagents-limits").await.ok()?;
        serde_json::from_slice(&limits.get("route.fleet").await.ok()??).ok()
    })
}

#[test]
fn four_workers_at_concurrency_50_keep_together_to_the_routes_rate_with_almost_no_429() {
    const RUNS: usize = 2_000;
    const PER_SECOND: f64 = 100.0; // rpm = 6,000
    let (_serial, dir, server) = broker();
    let (stand_in, url) = StandIn::start(Policy::Rate { per_second: PER_SECOND });
    let config = worker_config(dir.path(), &url, "rpm = 6000");
    let flags = ["--config", &config, "--provider", "spawn", "--concurrency", "50"];
    let _workers: Vec<Worker> =
        (1..=4).map(|n| Worker::start(dir.path(), &server.url(), &format!("w{n}"), &flags)).collect();
    let runtime = caller(dir.path(), &server);

    let started = Instant::now();
    let completed = run_all(&runtime, RUNS, 400);
    let elapsed = started.elapsed();

    assert_eq!(completed, RUNS, "every run completes");
    let (answered, refused) = (stand_in.answered.load(Ordering::Relaxed), stand_in.refused.load(Ordering::Relaxed));
    let requests = answered + refused;
    let rate = stand_in.rate();
    eprintln!(
        "{RUNS} runs on 4 workers in {elapsed:?}: {refused} of {requests} requests answered 429, \
         {rate:.1} admitted a second (the limit: {PER_SECOND})"
    );
    assert!(refused * 50 <= requests, "{refused} of {requests} requests were answered 429 (more than 2%)");
    // What the fleet sent, refused or not: the stand-in's bucket caps only
    // what it admits.
    let (sent, most_in_a_second) = stand_in.received();
    eprintln!("sent {sent:.1} a second overall, at most {most_in_a_second} in one second");
    assert!(sent <= PER_SECOND * 1.03, "{sent:.1} requests a second sent: faster than the route allows");
    assert!(
        most_in_a_second as f64 <= PER_SECOND * 1.25,
        "{most_in_a_second} requests sent in one second: more than the route's rate and the stand-in's burst"
    );
    assert!(rate <= PER_SECOND * 1.02, "{rate:.1} a second: faster than the route allows");
    assert!(rate >= PER_SECOND * 0.85, "{rate:.1} a second: less than 85% of the rate the route allows");
    let members = record(&server.url()).expect("the route's record is on the broker")["members"].clone();
    assert_eq!(members.as_object().map(|m| m.len()), Some(4), "four members: {members}");
    runtime.shutdown_blocking();
}

#[test]
fn a_worker_killed_mid_batch_leaves_the_fleet_within_its_lease_and_the_rest_keep_the_rate() {
    const RUNS: usize = 600;
    const PER_SECOND: f64 = 100.0;
    let (_serial, dir, server) = broker();
    let (stand_in, url) = StandIn::start(Policy::Rate { per_second: PER_SECOND });
    let config = worker_config(dir.path(), &url, "rpm = 6000\nmax_concurrent = 40");
    let flags = ["--config", &config, "--provider", "spawn", "--concurrency", "50"];
    let mut workers: Vec<Worker> =
        (1..=4).map(|n| Worker::start(dir.path(), &server.url(), &format!("w{n}"), &flags)).collect();
    let runtime = caller(dir.path(), &server);
    let batch = std::thread::spawn({
        let dir = dir.path().to_owned();
        let url = server.url();
        move || {
            let runtime = super::support::caller_with(&dir.join("second"), super::support::config(&url));
            let completed = run_all(&runtime, RUNS, 200);
            runtime.shutdown_blocking();
            completed
        }
    });
    let deadline = Instant::now() + WAIT_LIMIT;
    while stand_in.answered.load(Ordering::Relaxed) < 100 {
        assert!(Instant::now() < deadline, "the batch never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    let members = |record: &Value| record["members"].as_object().map_or(0, |m| m.len());
    assert_eq!(members(&record(&server.url()).unwrap()), 4);
    workers[0].kill();
    let killed = Instant::now();
    // Its lease ends within the lease TTL; the next booking after that
    // drops it (bookings come every few tens of ms while runs remain).
    let bound = Duration::from_millis(LEASE_TTL_MS) + Duration::from_secs(3);
    loop {
        if members(&record(&server.url()).unwrap()) == 3 {
            break;
        }
        assert!(killed.elapsed() < bound, "the killed worker still holds its share after {:?}", killed.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("the killed worker left the fleet {:?} after SIGKILL", killed.elapsed());
    assert_eq!(batch.join().unwrap(), RUNS, "every run completes (the killed worker's after their ack wait)");
    let (answered, refused) = (stand_in.answered.load(Ordering::Relaxed), stand_in.refused.load(Ordering::Relaxed));
    assert!(refused * 50 <= answered + refused, "{refused} of {} requests answered 429", answered + refused);
    runtime.shutdown_blocking();
}

#[test]
fn calls_longer_than_the_lease_keep_their_worker_counted_so_the_fleet_stays_under_max_concurrent() {
    const RUNS: usize = 40;
    const MAX_CONCURRENT: usize = 10;
    // Each call outlasts the lease (2 s): a worker that renewed only when
    // it booked would drop out of the fleet while its calls run, and the
    // other would take the whole of `max_concurrent` beside them.
    let delay = Duration::from_millis(LEASE_TTL_MS + 1_000);
    let (_serial, dir, server) = broker();
    let (stand_in, url) = StandIn::start(Policy::Slow { delay });
    let config = worker_config(dir.path(), &url, &format!("max_concurrent = {MAX_CONCURRENT}"));
    let flags = ["--config", &config, "--provider", "spawn", "--concurrency", "10"];
    let workers: Vec<Worker> =
        (1..=2).map(|n| Worker::start(dir.path(), &server.url(), &format!("w{n}"), &flags)).collect();
    let runtime = caller(dir.path(), &server);

    assert_eq!(run_all(&runtime, RUNS, RUNS), RUNS, "every run completes");

    // Both workers take their first calls at once, before either has seen
    // the other's lease: the fleet's slots are counted from the first
    // request all the same, and from the second round on both stay counted.
    let log = stand_in.log.lock().unwrap().clone();
    let settled = log[0].0 + delay + Duration::from_millis(500);
    let most = log.iter().filter(|(at, _, _)| *at >= settled).map(|(_, in_flight, _)| *in_flight).max();
    let first_round = log.iter().filter(|(at, _, _)| *at < settled).map(|(_, in_flight, _)| *in_flight).max();
    eprintln!(
        "calls in flight at once: {first_round:?} in the first round, {most:?} after (max_concurrent {MAX_CONCURRENT})"
    );
    let (most, first_round) = (most.expect("calls after the first round"), first_round.expect("a first round"));
    assert!(
        first_round <= MAX_CONCURRENT,
        "{first_round} calls in flight at once in the first round: over the fleet's max_concurrent"
    );
    assert!(most <= MAX_CONCURRENT, "{most} calls in flight at once: over the fleet's max_concurrent");
    for worker in &workers {
        assert!(!worker.log().contains("shared = true"), "a worker shares the route: {}", worker.log());
    }
    runtime.shutdown_blocking();
}

#[test]
fn bare_429s_seen_by_one_worker_back_the_whole_fleet_off_and_answered_calls_grow_it_back() {
    const RUNS: usize = 1_500;
    const SHARE: usize = 20;
    let delay = Duration::from_millis(200);
    let (_serial, dir, server) = broker();
    // Each worker calls a stand-in of its own, so what the first sees is
    // the fleet's doing: only the second is ever refused.
    let (first, first_url) = StandIn::start(Policy::Slow { delay });
    let (second, second_url) = StandIn::start(Policy::Slow { delay });
    let limits = format!("max_concurrent = {}", SHARE * 2);
    let first_home = dir.path().join("first");
    let second_home = dir.path().join("second");
    std::fs::create_dir_all(&first_home).unwrap();
    std::fs::create_dir_all(&second_home).unwrap();
    let first_config = worker_config(&first_home, &first_url, &limits);
    let second_config = worker_config(&second_home, &second_url, &limits);
    let flags = |config: &str| {
        [
            "--config".to_owned(),
            config.to_owned(),
            "--provider".into(),
            "spawn".into(),
            "--concurrency".into(),
            SHARE.to_string(),
        ]
    };
    let (first_flags, second_flags) = (flags(&first_config), flags(&second_config));
    let first_flags: Vec<&str> = first_flags.iter().map(String::as_str).collect();
    let second_flags: Vec<&str> = second_flags.iter().map(String::as_str).collect();
    let _workers = [
        Worker::start(dir.path(), &server.url(), "w1", &first_flags),
        Worker::start(dir.path(), &server.url(), "w2", &second_flags),
    ];
    let runtime = caller(dir.path(), &server);
    let refusing = std::thread::spawn({
        let (first, second) = (first.clone(), second.clone());
        move || {
            // Once the first worker runs at its share, the second is refused.
            let deadline = Instant::now() + WAIT_LIMIT;
            while first.log.lock().unwrap().iter().filter(|(_, in_flight, _)| *in_flight >= SHARE - 2).count() < 5 {
                assert!(Instant::now() < deadline, "the first worker never reached its share");
                std::thread::sleep(Duration::from_millis(20));
            }
            let armed = Instant::now();
            second.bare_refusals.store(6, Ordering::SeqCst);
            armed
        }
    });

    assert_eq!(run_all(&runtime, RUNS, 100), RUNS, "every run completes");
    let armed = refusing.join().unwrap();

    let refused = second.refused.load(Ordering::Relaxed);
    assert!(refused >= 1, "the second worker was refused");
    // Counted from the first refusal the second stand-in gave (on a loaded
    // machine that may come well after it was armed).
    let refused_at =
        second.log.lock().unwrap().iter().filter(|(_, _, status)| *status == 429).map(|(at, _, _)| *at).min();
    let refused_at = refused_at.expect("a refusal is logged").max(armed);
    let log = first.log.lock().unwrap().clone();
    let before = log.iter().filter(|(at, _, _)| *at < refused_at).map(|(_, n, _)| *n).max().unwrap_or(0);
    // After the refusals: the first worker's calls in flight, half a second at a time.
    let after: Vec<usize> = (0..24)
        .map(|second| {
            let from = refused_at + Duration::from_millis(500 * second);
            let to = from + Duration::from_millis(500);
            log.iter().filter(|(at, _, _)| *at >= from && *at < to).map(|(_, n, _)| *n).max().unwrap_or(0)
        })
        .collect();
    eprintln!("first worker (never refused): {before} in flight before, then by half-seconds {after:?}; {refused} bare 429s to the second");
    // Within five seconds of the refusals (a quiet machine: one), well
    // under its share: the fleet's ceiling halves to at most half of what
    // the refused worker had in flight, times two members, and the
    // ceiling regrows meanwhile, so the low point is near half the share
    // at best; without the fleet's back-off it stays at the share.
    let lowest = after.iter().take(10).copied().min().unwrap();
    assert!(lowest <= SHARE * 3 / 4, "the fleet's ceiling never reached the worker that was not refused: {after:?}");
    let regrown = after.iter().skip_while(|n| **n > lowest).copied().max().unwrap();
    assert!(regrown > lowest, "answered calls never grew the fleet back: {after:?}");
    runtime.shutdown_blocking();
}

#[test]
fn a_broker_restarted_mid_batch_leaves_each_worker_on_its_fraction_saying_so_and_every_run_settles() {
    const RUNS: usize = 400;
    const PER_SECOND: f64 = 100.0;
    let (_serial, dir, mut server) = broker();
    let (stand_in, url) = StandIn::start(Policy::Rate { per_second: PER_SECOND });
    let config = worker_config(dir.path(), &url, "rpm = 6000");
    let flags = ["--config", &config, "--provider", "spawn", "--concurrency", "50"];
    let workers: Vec<Worker> =
        (1..=2).map(|n| Worker::start(dir.path(), &server.url(), &format!("w{n}"), &flags)).collect();
    let runtime = caller(dir.path(), &server);
    // Every run is stored before the broker goes: the drill is the
    // workers' schedule, not the caller's starts.
    let subagents = runtime.subagents();
    let runs = runtime.within(WAIT_LIMIT, "every run to start", async move {
        let starts = (0..RUNS).map(|n| subagents.start("remote", request(&format!("task {n}"))));
        futures_util::future::join_all(starts).await.into_iter().map(Result::unwrap).collect::<Vec<_>>()
    });
    let deadline = Instant::now() + WAIT_LIMIT;
    while stand_in.answered.load(Ordering::Relaxed) < 80 {
        assert!(Instant::now() < deadline, "the batch never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Down for longer than several bookings: each worker finds the
    // schedule out of reach while it still has runs to call for.
    server.restart_after(Duration::from_millis(1500));
    let results = runtime.within(WAIT_LIMIT, "every run to settle after the restart", async move {
        let settle = runs.iter().map(|run| async move {
            let result = run.result().await;
            let _ = run.dispose().await;
            result.map(|result| result.stop_reason)
        });
        futures_util::future::join_all(settle).await
    });
    let completed = results.iter().filter(|result| matches!(result, Ok(StopReason::Completed))).count();
    let (answered, refused) = (stand_in.answered.load(Ordering::Relaxed), stand_in.refused.load(Ordering::Relaxed));
    let (sent, most_in_a_second) = stand_in.received();
    eprintln!(
        "broker restarted mid-batch: {completed} of {RUNS} completed; {refused} of {} requests answered 429; \
         sent {sent:.1} a second overall, at most {most_in_a_second} in one second",
        answered + refused
    );
    assert_eq!(completed, RUNS, "every run completes: {results:?}");
    assert!(refused * 20 <= answered + refused, "{refused} of {} requests answered 429", answered + refused);
    assert!(sent <= PER_SECOND * 1.1, "{sent:.1} requests a second sent: faster than the route allows");
    let logs: String = workers.iter().map(Worker::log).collect();
    assert!(logs.contains("out of reach"), "a worker said it kept to its own fraction: {logs}");
    assert!(logs.contains("shared schedule is back"), "and that the fleet's limits hold again: {logs}");
    runtime.shutdown_blocking();
}

#[test]
fn a_429_with_retry_after_seen_by_one_worker_pauses_the_whole_fleet() {
    const RUNS: usize = 600;
    let (_serial, dir, server) = broker();
    let (stand_in, url) = StandIn::start(Policy::Slow { delay: Duration::from_millis(50) });
    let config = worker_config(dir.path(), &url, "rpm = 6000");
    let flags = ["--config", &config, "--provider", "spawn", "--concurrency", "20"];
    let _workers: Vec<Worker> =
        (1..=2).map(|n| Worker::start(dir.path(), &server.url(), &format!("w{n}"), &flags)).collect();
    let runtime = caller(dir.path(), &server);
    let arming = std::thread::spawn({
        let stand_in = stand_in.clone();
        move || {
            let deadline = Instant::now() + WAIT_LIMIT;
            while stand_in.answered.load(Ordering::Relaxed) < 100 {
                assert!(Instant::now() < deadline, "the batch never got going");
                std::thread::sleep(Duration::from_millis(20));
            }
            stand_in.advised_refusals.store(1, Ordering::SeqCst);
        }
    });
    assert_eq!(run_all(&runtime, RUNS, 100), RUNS, "every run completes");
    arming.join().unwrap();

    let log = stand_in.log.lock().unwrap().clone();
    let refused_at = log.iter().find(|(_, _, status)| *status == 429).expect("one request was refused").0;
    // The refusal said two seconds. Starts a worker had booked before it
    // heard may still arrive just after; from then on, nothing from
    // either worker until the two seconds are over.
    let (quiet_from, quiet_to) = (refused_at + Duration::from_millis(400), refused_at + Duration::from_millis(1_900));
    let inside: Vec<Duration> = log
        .iter()
        .filter(|(at, _, _)| *at >= quiet_from && *at < quiet_to)
        .map(|(at, _, _)| *at - refused_at)
        .collect();
    let before =
        log.iter().filter(|(at, _, _)| *at < refused_at && *at + Duration::from_millis(1_500) >= refused_at).count();
    eprintln!("{before} requests in the 1.5 s before the refusal; {} inside its pause", inside.len());
    assert!(before > 50, "the fleet was busy when it was refused: {before} requests in the 1.5 s before");
    assert!(
        inside.is_empty(),
        "{} requests came inside the pause the refusal asked for, the first after the refusal: {:?}",
        inside.len(),
        &inside[..inside.len().min(8)]
    );
    runtime.shutdown_blocking();
}
