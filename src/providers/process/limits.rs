//! The route limiters a process child draws on: this parent's, lent over
//! the process wire (see [`crate::wire::limit`]).
//!
//! A child's `limit/admit` waits on the parent's [`Limiter`] for the route
//! it names, as a call of the parent's own would; the admission is then
//! held here under the ask's id until the child settles or releases it,
//! and what the child hears of the call (answered, refused, a cool-down)
//! is told to the same limiter, so its counts, its AIMD and its cool-downs
//! are those of every child and of the parent together.
//!
//! A child is hostile until shown otherwise: it has at most
//! [`MAX_OUTSTANDING`] asks open (one more is refused at once), no more
//! admitted calls than the route lets in flight (the limiter's own gate),
//! ids of bounded length, each in use once; a cool-down it asks for lasts
//! at most [`MAX_COOL_DOWN`]. What it settles beyond what its calls were
//! charged ahead is charged from one allowance of a minute of the route's
//! tokens for its whole life (with each call still at most a minute, and a
//! count past any model's context read as unknown by the limiter): a child
//! that settles hundreds of calls with huge counts stalls the route for a
//! minute once, not for hours. An honest child's usage stays under its
//! estimates (the input's and the answer's `max_tokens`), so the allowance
//! only meets a fault or a lie. When its wire closes (it exited, was killed,
//! broke the protocol) or its run is disposed, this task ends and every
//! admission it held and every wait is given back at once.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::{Cancelled, Limiter, Permit, MAX_COOL_DOWN, MAX_CREDIBLE_USAGE};
use crate::wire::limit::{fit_id, LimitAsk, MAX_OUTSTANDING};
use crate::wire::process::Replier;

/// JSON-RPC's "invalid params": what a refused ask is answered.
const REFUSED: i64 = -32602;

/// One ask of the child: waiting for the limiter, or admitted.
enum Lent {
    Waiting(CancellationToken),
    /// `answered`: the child said the call was answered (once counts: a
    /// child saying it again cannot grow the route's concurrency).
    Admitted {
        route: usize,
        permit: Permit,
        answered: bool,
    },
}

/// An admission's wait, ended: the ask's key and id, its route, and the
/// limiter's permit (or the wait's cancel).
type Admitting = LocalBoxFuture<'static, (String, Value, usize, Result<Permit, Cancelled>)>;

/// Answers the child's asks about `routes` until its wire closes.
pub(super) async fn lend(mut asks: mpsc::Receiver<LimitAsk>, routes: Rc<[(String, Limiter)]>, replier: Replier) {
    let mut lent: HashMap<String, Lent> = HashMap::new();
    let mut admitting: FuturesUnordered<Admitting> = FuturesUnordered::new();
    let mut beyond_estimates: Vec<Allowance> =
        routes.iter().map(|(_, limiter)| Allowance::a_minute_of(limiter)).collect();
    loop {
        tokio::select! {
            ask = asks.recv() => match ask {
                Some(ask) => hear(ask, &routes, &replier, &mut lent, &mut admitting, &mut beyond_estimates),
                // The wire closed: dropping what is held gives it back.
                None => return,
            },
            Some((key, id, route, admitted)) = admitting.next(), if !admitting.is_empty() => {
                let Ok(permit) = admitted else { continue };
                // A wait released meanwhile was removed: its permit drops here.
                if let Some(entry @ Lent::Waiting(_)) = lent.get_mut(&key) {
                    *entry = Lent::Admitted { route, permit, answered: false };
                    replier.reply(&id, json!({}));
                }
            }
        }
    }
}

/// What a child's settles may still charge a route beyond the estimates
/// its calls were charged ahead, over the child's life: a minute of the
/// route's tokens (nothing to count on a route without `tpm`).
struct Allowance {
    tokens_per_minute: Option<u64>,
    left: u64,
}

impl Allowance {
    fn a_minute_of(limiter: &Limiter) -> Allowance {
        let tokens_per_minute = limiter.limits().tokens_per_minute;
        Allowance { tokens_per_minute, left: tokens_per_minute.unwrap_or(0) }
    }

    /// What a call charged `estimate` ahead and reported `used` settles
    /// with: beyond the estimate, only what is left of the allowance. A
    /// count past any model's context passes as it is: the limiter reads it
    /// as unknown and keeps the estimate.
    fn charge(&mut self, used: u64, estimate: u64) -> u64 {
        let Some(tpm) = self.tokens_per_minute else { return used };
        if used > MAX_CREDIBLE_USAGE {
            return used;
        }
        let beyond = used.min(tpm).saturating_sub(estimate).min(self.left);
        self.left -= beyond;
        used.min(estimate + beyond)
    }
}

/// One ask: an admission to wait for, or news of one held.
fn hear(
    ask: LimitAsk,
    routes: &Rc<[(String, Limiter)]>,
    replier: &Replier,
    lent: &mut HashMap<String, Lent>,
    admitting: &mut FuturesUnordered<Admitting>,
    beyond_estimates: &mut [Allowance],
) {
    match ask {
        LimitAsk::Admit { id, admit } => {
            let key = id.to_string();
            let route = routes.iter().position(|(name, _)| *name == admit.route);
            let refused = match route {
                _ if !fit_id(&id) => Some("an ask without a usable id"),
                _ if lent.contains_key(&key) => Some("an ask with an id in use"),
                _ if lent.len() >= MAX_OUTSTANDING => Some("too many asks open at once"),
                None => Some("no such route is lent"),
                Some(_) => None,
            };
            let Some(route) = route.filter(|_| refused.is_none()) else {
                // An id too long to echo is answered with none.
                let id = if fit_id(&id) { id } else { Value::Null };
                replier.refuse(&id, REFUSED, refused.unwrap_or_default());
                return;
            };
            let token = CancellationToken::new();
            lent.insert(key.clone(), Lent::Waiting(token.clone()));
            let limiter = routes[route].1.clone();
            admitting.push(Box::pin(async move {
                let admitted = limiter.admit(admit.estimated_tokens, &token).await;
                (key, id, route, admitted)
            }));
        }
        LimitAsk::Answered { id } => {
            if let Some(Lent::Admitted { route, permit, answered: answered @ false }) = lent.get_mut(&id.to_string()) {
                *answered = true;
                routes[*route].1.answered(permit);
            }
        }
        LimitAsk::Refused { id, explained } => {
            if let Some(Lent::Admitted { route, permit, .. }) = lent.get(&id.to_string()) {
                routes[*route].1.refused(permit, explained);
            }
        }
        LimitAsk::Settle { id, used_tokens } => match lent.remove(&id.to_string()) {
            Some(Lent::Admitted { route, permit, .. }) => {
                let used_tokens = beyond_estimates[route].charge(used_tokens, permit.charged());
                permit.settle(used_tokens)
            }
            Some(Lent::Waiting(token)) => token.cancel(),
            None => {}
        },
        LimitAsk::Release { id } => {
            if let Some(Lent::Waiting(token)) = lent.remove(&id.to_string()) {
                token.cancel();
            }
        }
        LimitAsk::CoolDown { route, millis } => {
            if let Some((_, limiter)) = routes.iter().find(|(name, _)| *name == route) {
                let pause = Duration::from_millis(millis).min(MAX_COOL_DOWN);
                limiter.cool_down_until(tokio::time::Instant::now() + pause);
            }
        }
        LimitAsk::Unreadable { id: Some(id) } if fit_id(&id) => {
            replier.refuse(&id, REFUSED, "an ask that could not be read")
        }
        LimitAsk::Unreadable { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{RouteLimits, MAX_TOKEN_DEBT};
    use crate::wire::limit::Admit;
    use tokio::time::Instant;

    /// Lends `limiter` as route "route" to a child that is this test: its
    /// asks go in, the parent's answers come out.
    fn lent_to_a_test(limiter: &Limiter) -> (mpsc::Sender<LimitAsk>, mpsc::UnboundedReceiver<String>) {
        let (asks, asked) = mpsc::channel(1_024);
        let (out, answers) = mpsc::unbounded_channel();
        let routes: Rc<[(String, Limiter)]> = Rc::from(vec![("route".to_owned(), limiter.clone())]);
        tokio::task::spawn_local(async move {
            lend(asked, routes, Replier::for_test(&out)).await;
            drop(out);
        });
        (asks, answers)
    }

    /// The child takes 256 admissions charged nothing ahead and settles
    /// each with `used_tokens`.
    async fn take_and_settle(
        asks: &mpsc::Sender<LimitAsk>,
        answers: &mut mpsc::UnboundedReceiver<String>,
        round: u64,
        used_tokens: u64,
    ) {
        for n in 0..256 {
            let admit = Admit { route: "route".to_owned(), estimated_tokens: 0 };
            asks.send(LimitAsk::Admit { id: json!(round * 1_000 + n), admit }).await.unwrap();
        }
        for _ in 0..256 {
            let answer = answers.recv().await.unwrap();
            assert!(answer.contains("\"result\""), "every ask is admitted: {answer}");
        }
        for n in 0..256 {
            asks.send(LimitAsk::Settle { id: json!(round * 1_000 + n), used_tokens }).await.unwrap();
        }
        // Heard before the parent's next call.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_that_settles_its_calls_with_huge_counts_stalls_the_route_a_minute_once() {
        tokio::task::LocalSet::new()
            .run_until(async {
                let limiter = Limiter::new(RouteLimits { tokens_per_minute: Some(60_000), ..RouteLimits::default() });
                let (asks, mut answers) = lent_to_a_test(&limiter);
                let cancel = CancellationToken::new();
                // 10^18 tokens a call: past any model's context, no bill.
                take_and_settle(&asks, &mut answers, 0, 1_000_000_000_000_000_000).await;
                let start = Instant::now();
                drop(limiter.admit(0, &cancel).await.unwrap());
                assert_eq!(start.elapsed(), Duration::ZERO, "10^18 tokens a call read as unknown");
                // Ten million a call, each charged at most a minute: the
                // child's calls together charge one minute, not 256.
                take_and_settle(&asks, &mut answers, 1, 10_000_000).await;
                let start = Instant::now();
                drop(limiter.admit(0, &cancel).await.unwrap());
                assert!(start.elapsed() <= MAX_TOKEN_DEBT, "the parent waited {:?}", start.elapsed());
                // And once for its life: again, and the route is not stalled.
                take_and_settle(&asks, &mut answers, 2, 10_000_000).await;
                let start = Instant::now();
                drop(limiter.admit(0, &cancel).await.unwrap());
                assert_eq!(start.elapsed(), Duration::ZERO, "the child's allowance was spent");
            })
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_honest_child_is_charged_its_calls_usage() {
        tokio::task::LocalSet::new()
            .run_until(async {
                let limiter = Limiter::new(RouteLimits { tokens_per_minute: Some(60_000), ..RouteLimits::default() });
                let (asks, mut answers) = lent_to_a_test(&limiter);
                let admit = Admit { route: "route".to_owned(), estimated_tokens: 4_000 };
                asks.send(LimitAsk::Admit { id: json!(1), admit }).await.unwrap();
                assert!(answers.recv().await.unwrap().contains("\"result\""));
                // It used a little more than it said: the difference is charged.
                asks.send(LimitAsk::Settle { id: json!(1), used_tokens: 5_000 }).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                let start = Instant::now();
                drop(limiter.admit(0, &CancellationToken::new()).await.unwrap());
                assert_eq!(start.elapsed(), Duration::from_millis(4_999));
            })
            .await;
    }
}
