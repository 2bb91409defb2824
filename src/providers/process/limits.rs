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
//! at most [`MAX_COOL_DOWN`]. When its wire closes (it exited, was killed,
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

use crate::agent::{Cancelled, Limiter, Permit, MAX_COOL_DOWN};
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
    loop {
        tokio::select! {
            ask = asks.recv() => match ask {
                Some(ask) => hear(ask, &routes, &replier, &mut lent, &mut admitting),
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

/// One ask: an admission to wait for, or news of one held.
fn hear(
    ask: LimitAsk,
    routes: &Rc<[(String, Limiter)]>,
    replier: &Replier,
    lent: &mut HashMap<String, Lent>,
    admitting: &mut FuturesUnordered<Admitting>,
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
            Some(Lent::Admitted { permit, .. }) => permit.settle(used_tokens),
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
