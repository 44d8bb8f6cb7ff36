//! # fmx-shm: the shared-memory transport
//!
//! Processes on one host. Each process owns a segment file under `/dev/shm`
//! (memmap2) holding one inbound single-producer/single-consumer ring per
//! sender; senders copy eager messages straight into the receiver's slot
//! (one copy in, one copy out, one cache-line handoff for small messages).
//! Messages larger than a slot move with one `process_vm_readv` from the
//! sender's buffer into the receiver's (single copy, no staging).
//!
//! Life cycle: [`ShmSetup::create`] makes our segment, the bootstrap
//! exchanges [`ShmSetup::address`]es, [`ShmSetup::connect`] maps the peers'
//! segments, and after a barrier [`ShmEndpoint::unlink`] removes our file:
//! from then on nothing is left in `/dev/shm` even if the job is killed.
//! Launchers also call [`cleanup_job`] when a job ends.
//!
//! Flow control: the credits of `fmx_transport::credit` (FM's send rule),
//! returned piggybacked in headers or in explicit credit messages through a
//! small control reserve.
//!
//! Settings: `FMX_SHM_POOL_SLOTS` (eager pool slots `P`, default 64),
//! `FMX_SHM_SLOT_BYTES` (default 16 KiB), `FMX_NEWCOMER_CREDITS` (default 2),
//! `FMX_CREDIT_THRESHOLD` (default half a peer's slice), `FMX_SHM_DIR`
//! (default `/dev/shm`).
//!
//! ## Thread safety
//! An endpoint is driven by one thread at a time; no lock on the data path.

pub mod cma;
pub mod endpoint;
pub mod layout;
pub mod ring;
pub mod segment;
mod staged;

pub use endpoint::{ShmConfig, ShmEndpoint, ShmSetup, DEFAULT_NEWCOMER_CREDITS, DEFAULT_POOL_SLOTS, DEFAULT_SLOT_BYTES};
pub use segment::{cleanup_job, segment_path, shm_dir};
