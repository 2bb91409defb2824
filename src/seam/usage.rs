//! What a run spent on its model: tokens by kind, model calls, HTTP
//! attempts, and time waited on the route's rate limits ([`RunUsage`]).
//!
//! A run's result carries its own ([`RunResult::usage`](super::RunResult::usage));
//! a [`Receipt`](super::Receipt) adds up its tree
//! ([`Receipt::usage_in_tree`](super::Receipt::usage_in_tree)). Token kinds
//! do not overlap: `input_tokens` are the prompt tokens neither read from
//! nor written to a prompt cache, so [`RunUsage::tokens`] (the figure a
//! budget's token limit counts) is the plain sum of the four.
//!
//! ```
//! use subagents::seam::RunUsage;
//!
//! let mut tree = RunUsage { input_tokens: 100, output_tokens: 20, model_calls: 1, attempts: 2, ..RunUsage::default() };
//! tree += RunUsage { input_tokens: 10, cache_read_tokens: 90, output_tokens: 5, model_calls: 1, attempts: 1, ..RunUsage::default() };
//! assert_eq!(tree.tokens(), 225);
//! assert_eq!(tree.attempts, 3);
//! let json = serde_json::to_value(tree).unwrap();
//! assert_eq!(json["cache_read_tokens"], 90);
//! // Every field defaults: an older peer's `{}` reads as nothing spent.
//! assert_eq!(serde_json::from_str::<RunUsage>("{}").unwrap(), RunUsage::default());
//! ```

use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

/// A run's (or a tree's) model spending.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct RunUsage {
    /// Prompt tokens neither read from nor written to a cache.
    pub input_tokens: u64,
    /// Answer tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache.
    pub cache_write_tokens: u64,
    /// Model calls made (each answer, or each failed call, is one).
    pub model_calls: u64,
    /// HTTP attempts those calls took (retries included).
    pub attempts: u64,
    /// Milliseconds the calls waited on the route's limits: rate,
    /// concurrency and shared cool-downs.
    pub limit_wait_ms: u64,
}

impl RunUsage {
    /// All tokens, of every kind: what a budget's token limit counts.
    pub fn tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }

    /// Whether nothing was spent.
    pub fn is_empty(&self) -> bool {
        *self == RunUsage::default()
    }
}

impl Add for RunUsage {
    type Output = RunUsage;

    fn add(self, other: RunUsage) -> RunUsage {
        RunUsage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cache_read_tokens: self.cache_read_tokens.saturating_add(other.cache_read_tokens),
            cache_write_tokens: self.cache_write_tokens.saturating_add(other.cache_write_tokens),
            model_calls: self.model_calls.saturating_add(other.model_calls),
            attempts: self.attempts.saturating_add(other.attempts),
            limit_wait_ms: self.limit_wait_ms.saturating_add(other.limit_wait_ms),
        }
    }
}

impl AddAssign for RunUsage {
    fn add_assign(&mut self, other: RunUsage) {
        *self = *self + other;
    }
}

impl std::iter::Sum for RunUsage {
    fn sum<I: Iterator<Item = RunUsage>>(iter: I) -> RunUsage {
        iter.fold(RunUsage::default(), Add::add)
    }
}
