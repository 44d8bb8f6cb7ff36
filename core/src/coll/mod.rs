//! Collectives over a communicator's collective context.
//!
//! Algorithms, by size (`n` ranks, `m` bytes):
//!
//! | collective | small | large |
//! |---|---|---|
//! | barrier | dissemination, ceil(log2 n) rounds | — |
//! | bcast | binomial tree (m < 64 KiB or n ≤ 2) | scatter + ring allgather (van de Geijn) |
//! | reduce | binomial tree | binomial tree |
//! | allreduce | recursive doubling, non-powers of two folded in (m < 64 KiB or fewer elements than ranks) | ring reduce-scatter + ring allgather |
//! | gather(v), scatter(v) | linear at the root (every transfer is one message) | same |
//! | allgather | recursive doubling (n a power of two, m·n < 64 KiB) | ring |
//! | allgatherv | ring | ring |
//! | alltoall(v) | all sends and receives posted at once (m < 8 KiB per peer) | pairwise exchange, n−1 steps |
//!
//! User reductions must be associative and commutative.

mod allgather;
mod alltoall;
mod barrier;
mod bcast;
pub(crate) mod check;
mod gather;
mod op;
mod reduce;
pub(crate) mod util;

pub use op::{Op, Reduce};

/// Bytes below which latency-bound algorithms are used.
pub(crate) const SMALL_BYTES: usize = 64 << 10;
