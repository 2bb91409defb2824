//! Fresh ids: the one place the crate mints the names that must not repeat
//! — session ids, and the ids a remote caller, a remote run and a worker
//! go by on a broker.
//!
//! Every id is built on one UUID-shaped value, unique without a system call
//! per id: a per-process random base advanced by a counter through a
//! bijective mix, so ids never repeat within a process and collide across
//! processes only with 2⁻⁶⁴-scale odds. The prefixes say what an id names
//! to someone reading a broker's subjects or a log.
//!
//! ```
//! use subagents::agent::ids;
//!
//! let (first, second) = (ids::session_id(), ids::session_id());
//! assert_ne!(first, second);
//! assert_eq!(first.len(), 36); // UUID-shaped: 8-4-4-4-12 hex digits
//! ```

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::mix::splitmix64;

/// A fresh UUID-shaped value (version 4 bits set), as text.
fn fresh() -> String {
    static BASE: OnceLock<(u64, u64)> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let (base, salt) = *BASE.get_or_init(|| {
        let random = || std::collections::hash_map::RandomState::new().build_hasher().finish();
        (random(), random())
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let high = splitmix64(base.wrapping_add(n));
    let low = splitmix64(salt ^ high);
    uuid::Builder::from_random_bytes(((u128::from(high) << 64) | u128::from(low)).to_be_bytes()).into_uuid().to_string()
}

/// A fresh session id (also its file's name): UUID-shaped.
pub fn session_id() -> String {
    fresh()
}

/// A fresh id for one run sent to a remote pool: UUID-shaped.
#[cfg(feature = "remote")]
pub(crate) fn remote_run_id() -> String {
    fresh()
}

/// A fresh id for a remote provider's caller: `caller-` and a UUID.
#[cfg(feature = "remote")]
pub(crate) fn caller_id() -> String {
    format!("caller-{}", fresh())
}

/// A fresh id for a worker: `worker-`, its process id, and 8 hex digits
/// that tell two workers of one process apart.
#[cfg(feature = "remote")]
pub(crate) fn worker_id() -> String {
    format!("worker-{}-{}", std::process::id(), &fresh()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_do_not_repeat_and_keep_their_shapes() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| session_id()).collect();
        assert_eq!(ids.len(), 10_000);
        let id = session_id();
        let groups: Vec<usize> = id.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{id}");
        assert_eq!(&id[14..15], "4", "version 4: {id}");
    }
}
