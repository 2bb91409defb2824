//! A route's limiter lent across the process wire: the messages a `serve`
//! child sends to draw on its parent's limiter for a route, and the bounds
//! the parent holds a child to.
//!
//! The parent lends its routes in `initialize` (`limits: [names]`, and
//! `model_route`: the one the child's session model is on). A child that
//! draws on a lent route asks before each model call:
//!
//! - request `limit/admit {route, estimated_tokens}` (id `limit-N`),
//!   answered `{}` once the parent's limiter admits the call (the parent
//!   holds the admission under that id), or an error when the parent will
//!   not (an unknown route, an id in use or too long, too many asks);
//! - notifications about an admitted call, by its id: `limit/answered {id}`
//!   (the endpoint answered: a window of these grows the route's
//!   concurrency), `limit/refused {id, explained}` (a 429 or 529; without
//!   advice it halves the route's concurrency), `limit/settle {id,
//!   used_tokens}` (the call is over: its real usage is charged), and
//!   `limit/release {id}` (the child no longer needs it: a wait withdrawn,
//!   or a call over without a usage, which keeps its estimate);
//! - notification `limit/cool_down {route, millis}`: the endpoint said
//!   when to come back; no call on the route starts before then, in the
//!   parent or any of its children (at most [`MAX_COOL_DOWN`](crate::agent::MAX_COOL_DOWN)).
//!
//! A child holds at most [`MAX_OUTSTANDING`] asks at once (waiting or
//! admitted), and no more admitted calls than the route lets in flight; an
//! id is a number or a string of at most [`MAX_ID_BYTES`]. When the child's
//! wire closes, everything it held or waited for is given back at once.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The child asks for an admission.
pub(crate) const ADMIT: &str = "limit/admit";
/// The endpoint answered an admitted call.
pub(crate) const ANSWERED: &str = "limit/answered";
/// The endpoint refused an admitted call as over its limit.
pub(crate) const REFUSED: &str = "limit/refused";
/// An admitted call is over, with its usage.
pub(crate) const SETTLE: &str = "limit/settle";
/// The child no longer needs an ask: a wait withdrawn, a call over.
pub(crate) const RELEASE: &str = "limit/release";
/// The endpoint said when to come back.
pub(crate) const COOL_DOWN: &str = "limit/cool_down";

/// Asks one child may have open at once (waiting or admitted).
pub(crate) const MAX_OUTSTANDING: usize = 256;

/// The longest string id an ask may carry, in bytes.
pub(crate) const MAX_ID_BYTES: usize = 64;

/// Routes one `initialize` lends at most; a name is at most
/// [`MAX_ROUTE_NAME`] bytes.
pub(crate) const MAX_ROUTES: usize = 64;

/// The longest route name lent, in bytes.
pub(crate) const MAX_ROUTE_NAME: usize = 128;

/// `limit/admit`'s parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Admit {
    /// The lent route's name.
    pub route: String,
    /// What the call is charged before it goes.
    pub estimated_tokens: u64,
}

/// One message of the child about its parent's limiter, as read.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LimitAsk {
    /// `limit/admit`, under the request's `id`.
    Admit { id: Value, admit: Admit },
    /// `limit/answered`.
    Answered { id: Value },
    /// `limit/refused`.
    Refused { id: Value, explained: bool },
    /// `limit/settle`.
    Settle { id: Value, used_tokens: u64 },
    /// `limit/release`.
    Release { id: Value },
    /// `limit/cool_down`.
    CoolDown { route: String, millis: u64 },
    /// A `limit/…` message that could not be read; `id` when it was a
    /// request (it is answered with an error).
    Unreadable { id: Option<Value> },
}

impl LimitAsk {
    /// Whether `method` is one of these messages.
    pub(crate) fn is_limit(method: &str) -> bool {
        method.starts_with("limit/")
    }

    /// The message `method` with `id` (a request's) and `params`.
    pub(crate) fn read(method: &str, id: Option<&Value>, params: &Value) -> LimitAsk {
        let of = |key: &str| params.get(key).cloned();
        let read = match method {
            ADMIT => id.cloned().zip(Admit::deserialize(params).ok()).map(|(id, admit)| LimitAsk::Admit { id, admit }),
            ANSWERED => of("id").map(|id| LimitAsk::Answered { id }),
            REFUSED => of("id").map(|id| {
                let explained = params["explained"].as_bool().unwrap_or(false);
                LimitAsk::Refused { id, explained }
            }),
            SETTLE => of("id")
                .zip(params["used_tokens"].as_u64())
                .map(|(id, used_tokens)| LimitAsk::Settle { id, used_tokens }),
            RELEASE => of("id").map(|id| LimitAsk::Release { id }),
            COOL_DOWN => params["route"]
                .as_str()
                .zip(params["millis"].as_u64())
                .map(|(route, millis)| LimitAsk::CoolDown { route: route.to_owned(), millis }),
            _ => None,
        };
        read.unwrap_or_else(|| LimitAsk::Unreadable { id: id.cloned() })
    }
}

/// Whether `id` is one an ask may carry: a number, or a string of at most
/// [`MAX_ID_BYTES`]. Anything else is neither kept nor echoed back.
pub(crate) fn fit_id(id: &Value) -> bool {
    match id {
        Value::Number(_) => true,
        Value::String(id) => id.len() <= MAX_ID_BYTES,
        _ => false,
    }
}

/// The routes an `initialize` may lend: at most [`MAX_ROUTES`] names of at
/// most [`MAX_ROUTE_NAME`] bytes; the rest are not lent.
pub(crate) fn lendable(names: &[String]) -> impl Iterator<Item = &String> {
    names.iter().filter(|name| !name.is_empty() && name.len() <= MAX_ROUTE_NAME).take(MAX_ROUTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_message_is_read_and_what_cannot_be_read_says_whether_it_was_a_request() {
        let id = json!("limit-1");
        let admit = LimitAsk::read(ADMIT, Some(&id), &json!({"route": "fast", "estimated_tokens": 900}));
        assert_eq!(
            admit,
            LimitAsk::Admit { id: id.clone(), admit: Admit { route: "fast".into(), estimated_tokens: 900 } }
        );
        let refused = LimitAsk::read(REFUSED, None, &json!({"id": "limit-1", "explained": true}));
        assert_eq!(refused, LimitAsk::Refused { id: id.clone(), explained: true });
        let settle = LimitAsk::read(SETTLE, None, &json!({"id": "limit-1", "used_tokens": 12}));
        assert_eq!(settle, LimitAsk::Settle { id: id.clone(), used_tokens: 12 });
        let cool = LimitAsk::read(COOL_DOWN, None, &json!({"route": "fast", "millis": 1500}));
        assert_eq!(cool, LimitAsk::CoolDown { route: "fast".into(), millis: 1500 });
        let bad = LimitAsk::read(ADMIT, Some(&id), &json!({"route": 7}));
        assert_eq!(bad, LimitAsk::Unreadable { id: Some(id) });
        assert_eq!(LimitAsk::read("limit/explode", None, &json!({})), LimitAsk::Unreadable { id: None });
        assert!(fit_id(&json!(7)) && fit_id(&json!("limit-9")));
        assert!(!fit_id(&json!("x".repeat(MAX_ID_BYTES + 1))) && !fit_id(&json!({"id": 1})) && !fit_id(&Value::Null));
    }

    #[test]
    fn at_most_so_many_routes_of_a_bounded_name_are_lent() {
        let mut names: Vec<String> = (0..100).map(|n| format!("route-{n}")).collect();
        names.insert(0, "r".repeat(MAX_ROUTE_NAME + 1));
        names.insert(1, String::new());
        let lent: Vec<_> = lendable(&names).collect();
        assert_eq!(lent.len(), MAX_ROUTES);
        assert_eq!(lent[0], "route-0");
    }
}
