//! Provider implementations. Each depends only on the seam vocabulary
//! (`crate::seam`), never on the actors or on each other.
//!
//! | provider | when to choose it |
//! |---|---|
//! | [`mock`] | tests, demos and fault injection of your own lifecycles |

pub mod mock;

pub use mock::{Fault, FaultStage, MockEvent, MockProvider};
