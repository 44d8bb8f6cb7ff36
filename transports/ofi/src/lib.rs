//! # fmx-ofi: the libfabric transport
//!
//! One `FI_EP_RDM` endpoint per process over whatever provider the host has
//! (`tcp;ofi_rxm` and `shm` on ordinary hosts, `verbs;ofi_rxm` on RoCE and
//! InfiniBand, and efa, cxi, psm3 where they exist), its address vector
//! filled from the bootstrap's exchange of endpoint names.
//!
//! - **Eager**: tagged sends (the tag carries the sender's rank) into receive
//!   slots pre-posted from any source. Slots are credits (FM's send rule,
//!   `fmx_transport::credit`), so the provider never has to buffer an
//!   unexpected message: its own flow control is not relied on, because on
//!   RDM endpoints it is unbounded buffering (rxm's unexpected queue), not
//!   backpressure. Credits return piggybacked in headers or as an 8-byte
//!   `fi_write` of cumulative totals into the peer's mailbox. Messages up to
//!   the provider's inject size go with `fi_tinject` (no completion).
//! - **Rendezvous**: `fi_read`/`fi_write` straight between user buffers, in
//!   pieces of `FMX_OFI_PIECE_BYTES` bytes. Registration follows ownership: the
//!   core's registered buffers are registered once; plain slices are
//!   registered per operation only where the provider needs local
//!   descriptors (`FI_MR_LOCAL`).
//! - **Without FI_RMA** (or `FMX_OFI_RMA=0`): reads, writes and credit
//!   returns travel as tagged messages (GET/PUT requests, data with a
//!   matching tag), see `endpoint/tagged.rs`.
//! - **Registration modes**: `FI_MR_LOCAL`, `FI_MR_VIRT_ADDR` (else keys
//!   address offsets), `FI_MR_ALLOCATED`, `FI_MR_PROV_KEY` (else fmx picks
//!   unique keys), `FI_MR_ENDPOINT` (regions bound to the endpoint).
//! - **Completions** are read in batches of 16 from one tagged-format queue.
//! - **Failures**: an error completion (`fi_cq_readerr`) marks the peer dead
//!   with the provider's name and reason; peers on this host are also
//!   watched with a pidfd, peers elsewhere probed with 8-byte reads (a
//!   probe the provider refuses for `FMX_OFI_PEER_TIMEOUT` seconds also
//!   counts: rxm answers EAGAIN for ever toward a peer whose process is gone).
//!
//! Provider choice: libfabric's first (best) answer, `FMX_OFI_PROVIDER`
//! (an exact name such as `tcp;ofi_rxm`) or libfabric's own `FI_PROVIDER`;
//! the domain (an interface or device: `lo`, `eth0`, `rxe0`) by
//! `FMX_OFI_DOMAIN` (a comma-separated list is taken by rank), else the
//! provider's first.
//! Every rank must end up with the same provider (checked at connect).
//! Settings: `FMX_OFI_PIECE_BYTES`, `FMX_OFI_RMA`, `FMX_OFI_PEER_TIMEOUT`, and the shared
//! `FMX_POOL_SLOTS`, `FMX_SLOT_BYTES`, `FMX_NEWCOMER_CREDITS`, `FMX_CREDIT_THRESHOLD`.

mod address;
pub mod endpoint;
pub mod fabric;
pub mod info;
mod names;

pub use endpoint::{OfiConfig, OfiEndpoint, OfiSetup, DEFAULT_PIECE, DEFAULT_POOL_SLOTS, DEFAULT_SLOT_BYTES};
pub use fabric::{Info, MrMode};
pub use names::cleanup_job;

/// The libfabric version this build was compiled against.
pub const LIBFABRIC_VERSION: &str = sys::LIBFABRIC_VERSION;
