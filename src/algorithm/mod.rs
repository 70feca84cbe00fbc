//! Pure rate-limiting math: no I/O, no clock, no allocation but a bucket's records of holds.
//!
//! Every function takes the stored state and `now_ms` and returns the new state with a [`Reply`]. This module
//! is the single source of truth: the in-process store (`src/store/memory.rs`) calls it directly and the scripts in `lua/`
//! mirror it line for line, so one test table runs against both stores.

pub mod ban;
pub(crate) mod fleet;
pub mod hold;
pub mod leaky_bucket;
pub mod paced;
mod reply;
pub mod room;
pub mod token_bucket;
pub mod window;

pub use ban::Ban;
pub use hold::HoldAsk;
pub use leaky_bucket::{LeakyBucket, Tat};
pub use paced::Pace;
pub(crate) use reply::{ceil_div, ms};
pub use reply::{Reply, MAX_EXACT, NEVER};
pub use token_bucket::{TokenBucket, TokenBucketState};
pub use window::{FixedWindow, Frame, SlidingLog, SlidingWindow, WindowCount};
