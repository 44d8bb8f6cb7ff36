//! # fmx-verbs: the ibverbs transport
//!
//! One reliable-connected (RC) queue pair per peer, connected through the
//! bootstrap's exchange of addresses (QP number, PSN, LID, GID, mailbox key).
//! Works on RoCE v2 (rxe, mlx5: addressed by GID) and InfiniBand (by LID).
//!
//! - **Eager**: SENDs into receive slots pre-posted on a shared receive
//!   queue (per-QP receive queues on devices without one). Slots are credits
//!   (FM's send rule, `fmx_transport::credit`); credits return piggybacked in
//!   headers or as an 8-byte RDMA WRITE of cumulative totals into the peer's
//!   mailbox. Tiny messages go inline; one send in 16 is signaled; completions
//!   are polled in batches.
//! - **Rendezvous**: RDMA READ (or WRITE) straight between user buffers.
//!   Registration follows ownership, not interception: the core's registered
//!   buffers stay registered for their lifetime; plain slices are copied
//!   through pre-registered bounce buffers up to `FMX_VERBS_BOUNCE_BYTES`
//!   (64 KiB) and registered per operation above it.
//! - **Failures**: a failed completion (retry exceeded, remote access error,
//!   RNR) marks the peer dead with the device's reason; peers on this host are
//!   also watched with a pidfd, peers elsewhere probed with 0-byte RDMA WRITEs.
//!
//! Settings: `FMX_VERBS_DEVICE` (a name, or a comma-separated list taken by
//! rank), `FMX_VERBS_PORT`, `FMX_VERBS_GID_INDEX`, `FMX_VERBS_SRQ=0`,
//! `FMX_VERBS_INLINE_BYTES`, `FMX_VERBS_BOUNCE_BYTES`, `FMX_VERBS_ACK_TIMEOUT_EXP`,
//! `FMX_VERBS_RETRY_COUNT`, and the shared `FMX_POOL_SLOTS`, `FMX_SLOT_BYTES`,
//! `FMX_NEWCOMER_CREDITS`, `FMX_CREDIT_THRESHOLD`.

mod address;
mod channel;
pub mod device;
pub mod endpoint;
pub mod info;
pub mod probe;
mod slots;
mod sys;
mod wireup;

pub use device::{choose, device_for_rank, Chosen};
pub use endpoint::{VerbsConfig, VerbsEndpoint, VerbsSetup, DEFAULT_BOUNCE_MAX, DEFAULT_POOL_SLOTS, DEFAULT_SLOT_BYTES};

/// The RDMA devices libibverbs sees (empty when there is none).
pub fn devices() -> Vec<String> {
    sys::device_names().unwrap_or_default()
}
