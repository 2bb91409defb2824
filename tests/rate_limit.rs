//! Shared rate limits per model route, through real runs: a stand-in
//! chat-completions server on loopback that admits a fixed rate (429 with
//! `retry-after` beyond, counting what it answered), and spawn runs on an
//! `openai-chat` route whose limiter every run shares; and `process`
//! children drawing on their parent's limiter (`process_children.rs`).

#[cfg(feature = "process")]
mod process_children;

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Within, WAIT_LIMIT};
use futures_util::stream::{self, StreamExt};
use subagents::agent::{Api, ModelRoute, RouteLimits};
use subagents::providers::InProcessProvider;
use subagents::{CancellationToken, Parent, RunResult, Runtime, StartRequest, StopReason, Subagents};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the stand-in admits: `rate` requests a second with a burst of
/// `burst` (a GCRA bucket, as providers keep one), or a fixed answer.
#[derive(Clone, Copy)]
enum Policy {
    Rate {
        per_second: f64,
        burst: u32,
    },
    /// Refuses the first request with `retry-after: SECONDS`, admits the rest.
    RefuseFirst {
        retry_after_secs: u32,
    },
    /// Admits everything, each answer after `delay`.
    Slow {
        delay: Duration,
    },
    /// Refuses the first `refusals` requests with a bare 429 (no header
    /// says when to come back), then admits everything after `delay`.
    Overloaded {
        refusals: usize,
        delay: Duration,
    },
    /// As `Rate`, each admitted request answered after `delay`.
    #[cfg_attr(not(feature = "process"), allow(dead_code))]
    Paced {
        per_second: f64,
        burst: u32,
        delay: Duration,
    },
    /// Admits everything: the first request answered after `hold`, the
    /// rest at once.
    #[cfg_attr(not(feature = "process"), allow(dead_code))]
    FirstHeld {
        hold: Duration,
    },
}

/// The stand-in: its counts, and every request's arrival and status.
struct Server {
    url: String,
    answered: AtomicUsize,
    refused: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    log: Mutex<Vec<(Instant, u16)>>,
    policy: Policy,
    /// The bucket's theoretical arrival time (GCRA).
    bucket: Mutex<Option<Instant>>,
}

impl Server {
    async fn start(policy: Policy) -> Arc<Server> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let server = Arc::new(Server {
            url,
            answered: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
            policy,
            bucket: Mutex::new(None),
        });
        let serving = server.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serving.clone().connection(socket));
            }
        });
        server
    }

    /// One keep-alive connection: request after request until it closes.
    async fn connection(self: Arc<Self>, mut socket: TcpStream) {
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
            let response = self.answer().await;
            if socket.write_all(response.as_bytes()).await.is_err() {
                return;
            }
        }
    }

    /// Admits or refuses a request arriving now, and logs it.
    fn admit(&self) -> bool {
        let now = Instant::now();
        let mut log = self.log.lock().unwrap();
        let admitted = match self.policy {
            Policy::Rate { per_second, burst } | Policy::Paced { per_second, burst, .. } => {
                let spacing = Duration::from_secs_f64(1.0 / per_second);
                let tolerance = spacing * burst.saturating_sub(1);
                let mut bucket = self.bucket.lock().unwrap();
                let due = bucket.unwrap_or(now);
                if due.saturating_duration_since(now) > tolerance {
                    false
                } else {
                    *bucket = Some(due.max(now) + spacing);
                    true
                }
            }
            Policy::RefuseFirst { .. } => !log.is_empty(),
            Policy::Slow { .. } | Policy::FirstHeld { .. } => true,
            Policy::Overloaded { refusals, .. } => log.len() >= refusals,
        };
        log.push((now, if admitted { 200 } else { 429 }));
        admitted
    }

    async fn answer(&self) -> String {
        let admitted = self.admit();
        let nth = self.log.lock().unwrap().len();
        if !admitted {
            self.refused.fetch_add(1, Ordering::Relaxed);
            let retry_after = match self.policy {
                Policy::RefuseFirst { retry_after_secs } => format!("retry-after: {retry_after_secs}\r\n"),
                Policy::Overloaded { .. } => String::new(),
                _ => "retry-after: 1\r\n".to_owned(),
            };
            let body = r#"{"error":{"message":"rate limited"}}"#;
            return format!(
                "HTTP/1.1 429 Too Many Requests\r\n{retry_after}content-type: application/json\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            );
        }
        let in_flight = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        self.most_in_flight.fetch_max(in_flight, Ordering::AcqRel);
        match self.policy {
            Policy::Slow { delay } | Policy::Overloaded { delay, .. } | Policy::Paced { delay, .. } => {
                tokio::time::sleep(delay).await;
            }
            Policy::FirstHeld { hold } if nth == 1 => tokio::time::sleep(hold).await,
            _ => {}
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.answered.fetch_add(1, Ordering::Relaxed);
        let body = r#"{"choices":[{"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len())
    }
}

/// A runtime whose `spawn` provider runs every child on `route`.
fn runtime_on(route: &ModelRoute, home: &std::path::Path) -> (Runtime, Subagents) {
    let runtime = Runtime::builder().home(home).build().unwrap();
    let subagents = runtime.subagents();
    let model = route.build().unwrap();
    subagents.register_provider(InProcessProvider::spawn("spawn", model).in_memory()).unwrap().keep();
    (runtime, subagents)
}

fn route(server: &Server, limits: RouteLimits) -> ModelRoute {
    let mut route = ModelRoute::new("limited", Api::OpenAiChat, "stand-in", limits);
    route.base_url = Some(server.url.clone());
    route
}

/// `count` runs, at most `concurrency` at once; every result, and the wall time.
fn run_all(runtime: &Runtime, subagents: &Subagents, count: usize, concurrency: usize) -> (Vec<RunResult>, Duration) {
    let subagents = subagents.clone();
    runtime.within(WAIT_LIMIT, "every run to settle", async move {
        let started = Instant::now();
        let results = stream::iter(0..count)
            .map(|n| {
                let subagents = subagents.clone();
                async move {
                    let request =
                        StartRequest::new(format!("task {n}"), Parent::root("/tmp"), CancellationToken::new());
                    let run = subagents.start("spawn", request).await.unwrap();
                    let result = run.result().await.unwrap();
                    run.dispose().await.unwrap();
                    result
                }
            })
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
            .await;
        (results, started.elapsed())
    })
}

/// The stand-in, serving on a thread of its own.
fn server_on(policy: Policy) -> Arc<Server> {
    let (started, server) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let _ = started.send(Server::start(policy).await);
            std::future::pending::<()>().await
        });
    });
    server.recv_timeout(WAIT_LIMIT).expect("the stand-in server starts")
}

#[test]
fn a_thousand_runs_at_concurrency_200_keep_to_the_routes_rate_and_almost_never_meet_a_429() {
    const RUNS: usize = 1_000;
    const PER_SECOND: f64 = 100.0; // 6,000 a minute
    let home = tempfile::tempdir().unwrap();
    let server = server_on(Policy::Rate { per_second: PER_SECOND, burst: 5 });
    let limits = RouteLimits { requests_per_minute: Some(6_000), ..RouteLimits::default() };
    let (runtime, subagents) = runtime_on(&route(&server, limits), home.path());

    let (results, elapsed) = run_all(&runtime, &subagents, RUNS, 200);

    let completed = results.iter().filter(|r| r.stop_reason == StopReason::Completed).count();
    assert_eq!(completed, RUNS, "every run completes");
    let (answered, refused) = (server.answered.load(Ordering::Relaxed), server.refused.load(Ordering::Relaxed));
    assert_eq!(answered, RUNS);
    let requests = answered + refused;
    assert!(refused * 50 < requests, "{refused} of {requests} requests were answered 429 (2% or more)");
    // The limit's floor: the first request at 0, one every 10 ms after.
    let floor = Duration::from_secs_f64((RUNS - 1) as f64 / PER_SECOND);
    assert!(elapsed >= floor.mul_f64(0.99), "{elapsed:?}: faster than the limit allows ({floor:?})");
    assert!(elapsed <= floor.mul_f64(1.3), "{elapsed:?}: more than 1.3 times the limit's floor ({floor:?})");
    // Usage in every result: the tokens the server reported (12 prompt
    // tokens, 4 of them cached, 3 completion), the attempts, the waits.
    let usage = results.iter().map(|r| r.usage).fold(subagents::seam::RunUsage::default(), |a, b| a + b);
    assert_eq!((usage.input_tokens, usage.cache_read_tokens, usage.output_tokens), (8_000, 4_000, 3_000));
    assert_eq!(usage.model_calls, RUNS as u64);
    assert_eq!(usage.attempts, requests as u64, "every request the server saw is an attempt of some run");
    assert!(usage.limit_wait_ms > 60_000, "runs waited their turns: {} ms in all", usage.limit_wait_ms);
    eprintln!("{RUNS} runs in {elapsed:?} (floor {floor:?}); {refused} of {requests} requests answered 429");
    assert!(runtime.shutdown_blocking().live_after.is_quiescent());
}

#[test]
fn a_429_with_retry_after_pauses_every_run_on_the_route_not_only_the_refused_one() {
    let home = tempfile::tempdir().unwrap();
    let server = server_on(Policy::RefuseFirst { retry_after_secs: 1 });
    // 4 a second: the second run is due 250 ms after the first, time
    // enough for the 429 to reach the route first on a loaded machine (at
    // 50 ms apart it sometimes had not, and the second call was already sent).
    let limits = RouteLimits { requests_per_minute: Some(240), ..RouteLimits::default() };
    let (runtime, subagents) = runtime_on(&route(&server, limits), home.path());

    let (results, _) = run_all(&runtime, &subagents, 10, 10);

    assert!(results.iter().all(|r| r.stop_reason == StopReason::Completed), "{results:?}");
    let log = server.log.lock().unwrap().clone();
    assert_eq!(log.iter().filter(|(_, status)| *status == 429).count(), 1, "one refusal, and no other: {log:?}");
    let refused_at = log[0].0;
    let during = log.iter().skip(1).filter(|(at, _)| at.duration_since(refused_at) < Duration::from_millis(950));
    assert_eq!(during.count(), 0, "no run called while the route cooled down");
    assert_eq!(log.len(), 11);
    let attempts: Vec<u64> = results.iter().map(|r| r.usage.attempts).collect();
    assert_eq!(attempts.iter().sum::<u64>(), 11, "{attempts:?}");
    assert!(attempts.contains(&2), "the refused run tried again: {attempts:?}");
    let waited: Vec<u64> = results.iter().map(|r| r.usage.limit_wait_ms).collect();
    assert!(waited.iter().filter(|&&ms| ms >= 900).count() >= 9, "every run waited out the cool-down: {waited:?}");
    assert!(runtime.shutdown_blocking().live_after.is_quiescent());
}

#[test]
fn no_more_than_max_concurrent_calls_of_a_route_are_in_flight() {
    let home = tempfile::tempdir().unwrap();
    let server = server_on(Policy::Slow { delay: Duration::from_millis(100) });
    let limits = RouteLimits { max_concurrent: Some(3), ..RouteLimits::default() };
    let (runtime, subagents) = runtime_on(&route(&server, limits), home.path());

    let (results, elapsed) = run_all(&runtime, &subagents, 12, 12);

    assert!(results.iter().all(|r| r.stop_reason == StopReason::Completed), "{results:?}");
    assert_eq!(server.most_in_flight.load(Ordering::Acquire), 3, "three at a time, and no more");
    assert!(elapsed >= Duration::from_millis(390), "four rounds of three: {elapsed:?}");
    assert!(results.iter().filter(|r| r.usage.limit_wait_ms >= 90).count() >= 9, "{results:?}");
    assert!(runtime.shutdown_blocking().live_after.is_quiescent());
}

#[test]
fn bare_429s_halve_the_routes_concurrency_and_answered_calls_grow_it_back() {
    let home = tempfile::tempdir().unwrap();
    // Eight bare refusals, then every call answered after 20 ms.
    let server = server_on(Policy::Overloaded { refusals: 8, delay: Duration::from_millis(20) });
    let limits = RouteLimits { max_concurrent: Some(16), ..RouteLimits::default() };
    let route = route(&server, limits);
    let (runtime, subagents) = runtime_on(&route, home.path());
    assert_eq!(route.limiter().stats().concurrency, 16);

    // Sixteen calls at once: the first eight are refused with nothing said.
    let (results, _) = run_all(&runtime, &subagents, 16, 16);
    assert!(results.iter().all(|r| r.stop_reason == StopReason::Completed), "{results:?}");
    let after_overload = route.limiter().stats();
    assert_eq!((after_overload.refused, after_overload.refused_unexplained), (8, 8), "{after_overload:?}");
    assert!(after_overload.concurrency < 16, "the refusals drove the concurrency down: {after_overload:?}");

    // While it is down, no more than that many calls are in flight at once.
    server.most_in_flight.store(0, Ordering::Release);
    let down_to = after_overload.concurrency as usize;
    let (results, _) = run_all(&runtime, &subagents, 300, 32);
    assert!(results.iter().all(|r| r.stop_reason == StopReason::Completed));
    let recovered = route.limiter().stats();
    assert_eq!(recovered.concurrency, 16, "answered calls grew it back to the cap: {recovered:?}");
    assert_eq!(recovered.requests, 16 + 8 + 300, "every attempt was admitted once: {recovered:?}");
    let most = server.most_in_flight.load(Ordering::Acquire);
    assert!(most > down_to && most <= 16, "{most} in flight at most: above {down_to} as it grew, never above 16");
    eprintln!("bare 429s: concurrency down to {down_to}, back to {} after 300 answered", recovered.concurrency);
    assert!(runtime.shutdown_blocking().live_after.is_quiescent());
}
