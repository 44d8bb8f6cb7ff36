//! The trait every transport implements.

use crate::{MsgHeader, TransportError};

/// A process of the job, by index (0..size). Transports know nothing finer.
pub type PeerId = u32;

/// The result of a non-blocking eager send. Backpressure is not an error:
/// nothing was written and the caller keeps its data (FM: no credit, no send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum SendOutcome {
    /// The message is in the receiver's slot (or queued to the device).
    Sent,
    /// The receiver has no free slot for this sender right now; drive
    /// [`Endpoint::poll`] and try again.
    Backpressure,
    /// FM's send rule does not allow it yet: the peer has a larger ID and has
    /// not sent to us. Drive [`Endpoint::poll`]; its first message opens the way.
    NotAllowed,
}

/// A process's receive memory, by purpose (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiveMemory {
    /// The eager pool shared by all peers (fixed by configuration, not by the number of peers).
    pub eager_pool: usize,
    /// The eager slots each peer may use after reallocation (`slice × slot`).
    pub per_peer: usize,
    /// The control reserve (a few small slots per peer).
    pub control: usize,
    /// Slots posted for no peer in particular, where a device's first
    /// messages from peers not yet connected land (connections on demand).
    pub first_contact: usize,
    /// Slots for messages to ourselves.
    pub own: usize,
    /// Eager slot bytes that senders may fill now: the pool, or after
    /// [`Endpoint::publish_receive_shares`] only the senders' shares (the rest
    /// was given back to the system).
    pub eager_resident: usize,
}

impl ReceiveMemory {
    /// Receive memory of a transport whose slots never resize: `slice` eager
    /// slots and `ctrl` control slots per peer, `own` slots for messages to
    /// ourselves, each of `slot_bytes`.
    pub fn fixed(credit: &crate::credit::CreditConfig, peers: u32, slot_bytes: usize, own: usize) -> Self {
        let (peers, slice) = (peers as usize, credit.slice as usize);
        Self {
            eager_pool: slice * peers * slot_bytes,
            per_peer: slice * slot_bytes,
            control: credit.ctrl as usize * peers * slot_bytes,
            first_contact: 0,
            own: own * slot_bytes,
            eager_resident: slice * peers * slot_bytes,
        }
    }
}

/// A connection an endpoint holds toward one peer (a queue pair, a libfabric
/// address with its credits), and when it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The peer.
    pub peer: PeerId,
    /// When the connection was ready to carry messages.
    pub made_at: std::time::Instant,
}

/// A received message, still in its slot (see [`Endpoint::arrivals`]).
#[derive(Debug)]
#[must_use = "an arrival holds a slot until Endpoint::release"]
pub struct Arrival {
    /// The sender.
    pub peer: PeerId,
    /// Its header.
    pub header: MsgHeader,
    /// Where the transport keeps it (opaque outside the transport).
    pub slot: u64,
    /// Bytes of payload.
    pub len: usize,
}

/// Whether a one-sided operation finished inside the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum OpStatus {
    /// The data has moved.
    Done,
    /// In flight; [`Endpoint::poll_ops`] reports the id when it completes.
    Pending(u64),
}

/// What is known of a peer's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// Running.
    Alive,
    /// Called finalize: it sends nothing more, but what it sent can still be received.
    Finalized,
    /// The process exited or was killed without finalizing.
    Dead,
}

/// How a transport's memory registrations went (all zero where nothing is registered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegistrationStats {
    /// Registrations made, of every kind (pools, owned buffers, per operation).
    pub registrations: u64,
    /// Registrations made for one operation on a plain user slice.
    pub per_operation: u64,
    /// Operations that used a buffer registered for its lifetime (no registration).
    pub owned_hits: u64,
    /// Operations copied through pooled, pre-registered bounce buffers.
    pub bounced: u64,
}

/// What a peer needs to access an exposed buffer with a one-sided operation:
/// travels inside a rendezvous control message. 24 bytes on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteKey {
    /// Address in the owner's address space (or offset, per transport).
    pub addr: u64,
    /// Length of the exposed region.
    pub len: u64,
    /// The transport's access key (rkey, fi_mr_key, or 0 on shared memory).
    pub key: u64,
}

impl RemoteKey {
    /// Bytes of an encoded key.
    pub const BYTES: usize = 24;

    /// Encodes the key little-endian.
    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[0..8].copy_from_slice(&self.addr.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..24].copy_from_slice(&self.key.to_le_bytes());
        out
    }

    /// Decodes a key; `None` when `b` is too short.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b = b.get(..Self::BYTES)?;
        let at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Self { addr: at(0), len: at(8), key: at(16) })
    }

    /// The sub-range `[offset, offset+len)` of this key, checked against its bounds.
    pub fn slice(&self, peer: PeerId, offset: u64, len: u64) -> Result<Self, TransportError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Self { addr: self.addr + offset, len, key: self.key }),
            _ => Err(TransportError::RemoteBounds { peer, offset, len, region: self.len }),
        }
    }
}

/// A process's endpoint: its connections to every process of the job.
///
/// Static dispatch: the core holds an enum of concrete endpoints, so none of
/// these calls goes through a vtable on the data path.
pub trait Endpoint: Send {
    /// This process's index.
    fn local_id(&self) -> PeerId;

    /// Number of processes in the job.
    fn num_peers(&self) -> u32;

    /// Largest payload [`Endpoint::try_send`] takes; larger messages go rendezvous.
    fn max_eager(&self) -> usize;

    /// Sends `header` and `payload` into a slot the receiver owns, copying the
    /// payload once (or inline). Never overwrites a slot the receiver has not
    /// released: answers [`SendOutcome::Backpressure`] instead.
    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError>;

    /// Whether an eager message to `peer` would go out now (takes nothing).
    fn credit(&mut self, peer: PeerId) -> SendOutcome;

    /// Appends up to `max` received messages to `out`, in arrival order per
    /// sender, and makes progress. Each stays in its slot (no copy) until
    /// [`Endpoint::release`]: read it with [`Endpoint::payload`] meanwhile,
    /// with the endpoint free for other calls (a read the message asks for).
    /// Release each once, in any order (where slots are reused in ring order,
    /// as on shared memory, a slot's credit goes back once the older ones
    /// from its sender are released too). Returns how many it appended.
    fn arrivals(&mut self, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError>;

    /// The payload of `arrival`, in its slot.
    fn payload(&self, arrival: &Arrival) -> &[u8];

    /// Gives `arrival`'s slot back: the sender gets its credit again.
    fn release(&mut self, arrival: Arrival) -> Result<(), TransportError>;

    /// Hands up to `max` received messages to `sink` (each while it still
    /// sits in its slot), releases them and returns their credits:
    /// [`Endpoint::arrivals`] for a caller that needs the endpoint for
    /// nothing else meanwhile.
    fn poll<F>(&mut self, max: usize, mut sink: F) -> Result<usize, TransportError>
    where
        F: FnMut(PeerId, &MsgHeader, &[u8]),
    {
        let mut got = Vec::new();
        let n = self.arrivals(max, &mut got)?;
        let mut first = None;
        for a in got.drain(..) {
            sink(a.peer, &a.header, self.payload(&a));
            if let Err(e) = self.release(a) {
                first.get_or_insert(e);
            }
        }
        if let Some(e) = first {
            return Err(e);
        }
        // Nothing more is taken (max 0): the released slots' credits go back.
        self.arrivals(0, &mut got)?;
        Ok(n)
    }

    /// Makes `buf` readable by peers through the returned key until
    /// [`Endpoint::revoke`].
    ///
    /// # Safety
    /// `buf` must stay allocated and unmoved until `revoke(&key)` returns (or
    /// the endpoint is dropped): a peer's device or process reads it directly,
    /// beyond any borrow. fmx's core guarantees it through [`crate::lend`].
    unsafe fn expose(&mut self, buf: &[u8]) -> Result<RemoteKey, TransportError>;

    /// Makes `buf` writable by peers, like [`Endpoint::expose`].
    ///
    /// # Safety
    /// As [`Endpoint::expose`], and nothing else may read or write `buf`
    /// until the revoke: a peer writes into it.
    unsafe fn expose_mut(&mut self, buf: &mut [u8]) -> Result<RemoteKey, TransportError>;

    /// [`Endpoint::expose`] for a key that `peer` will use: a transport that
    /// reaches peers through different endpoints exposes through the one
    /// that serves `peer`. The same as `expose` elsewhere.
    ///
    /// # Safety
    /// As [`Endpoint::expose`].
    unsafe fn expose_to(&mut self, peer: PeerId, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        let _ = peer;
        // SAFETY: the caller's promise is `expose`'s.
        unsafe { self.expose(buf) }
    }

    /// [`Endpoint::expose_mut`] for a key that `peer` will use (see [`Endpoint::expose_to`]).
    ///
    /// # Safety
    /// As [`Endpoint::expose_mut`].
    unsafe fn expose_mut_to(&mut self, peer: PeerId, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        let _ = peer;
        // SAFETY: the caller's promise is `expose_mut`'s.
        unsafe { self.expose_mut(buf) }
    }

    /// Ends remote access through `key`.
    fn revoke(&mut self, key: &RemoteKey);

    /// Reads `local.len()` bytes of `peer`'s exposed `remote` region into `local`.
    ///
    /// # Safety
    /// When it answers [`OpStatus::Pending`], `local` must stay allocated,
    /// unmoved and untouched until [`Endpoint::poll_ops`] reports the id (or
    /// [`Endpoint::abandon`] returned true, or the endpoint is dropped): the
    /// device writes into it after this call has returned and its borrow ended.
    ///
    /// Safe code cannot call it, so this misuse, which let a device write
    /// into freed memory while `read` was a safe function, no longer compiles:
    /// ```compile_fail,E0133
    /// fn misuse(ep: &mut impl fmx_transport::Endpoint, key: &fmx_transport::RemoteKey) {
    ///     let mut v = vec![0u8; 1 << 20];
    ///     let _ = ep.read(1, key, &mut v); // may answer Pending...
    ///     drop(v); // ...and the device would write here after the free
    /// }
    /// ```
    unsafe fn read(&mut self, peer: PeerId, remote: &RemoteKey, local: &mut [u8]) -> Result<OpStatus, TransportError>;

    /// Writes `local` into `peer`'s exposed `remote` region.
    ///
    /// # Safety
    /// When it answers [`OpStatus::Pending`], `local` must stay allocated and
    /// unmoved, and unwritten, until [`Endpoint::poll_ops`] reports the id (as
    /// for [`Endpoint::read`]): the device reads it after this call returned.
    unsafe fn write(&mut self, peer: PeerId, local: &[u8], remote: &RemoteKey) -> Result<OpStatus, TransportError>;

    /// Gives up on every one-sided operation still in flight, because the
    /// job is failing or their peer is gone and they may never complete:
    /// afterwards none of them touches memory again (each reports as failed
    /// through [`Endpoint::poll_ops`]), so their buffers may be freed. The
    /// endpoint may be unusable afterwards (libfabric: it is closed). Returns
    /// false when the transport cannot end them by itself: the caller then
    /// waits for them (a device reports them failed after its retry budget).
    fn abandon(&mut self, why: &str) -> bool {
        let _ = why;
        false
    }

    /// Reports one-sided operations that completed since the last call.
    fn poll_ops<F>(&mut self, done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>);

    /// What is known of `peer`'s process. May cost a system call: call it
    /// while waiting, not per message.
    fn peer_state(&mut self, peer: PeerId) -> PeerState;

    /// Grants every peer its whole share of our eager pool ("no one else will
    /// join"); called once after every process has joined.
    fn reallocate_credits(&mut self) -> Result<(), TransportError>;

    /// Where our receive memory goes.
    fn receive_memory(&self) -> ReceiveMemory;

    /// Whether the connection to `peer` is made by the first message
    /// between us (`FMX_CONNECT=lazy`), so that no join at init must reach
    /// it. `false` by default: the transport is ready toward every peer once
    /// the job has joined.
    fn connects_on_demand(&self, peer: PeerId) -> bool {
        let _ = peer;
        false
    }

    /// Starts connecting to `peer` ahead of its first message (a graph's
    /// declared neighbours); `true` once the connection exists (or none is
    /// needed: the default).
    fn preconnect(&mut self, peer: PeerId) -> Result<bool, TransportError> {
        let _ = peer;
        Ok(true)
    }

    /// The connections this endpoint holds, by peer. None by default: shared
    /// memory maps one segment for the node and keeps nothing per peer.
    fn connections(&self) -> Vec<Connection> {
        Vec::new()
    }

    /// Sizes each sender's share of our eager pool by `weights[sender]`
    /// (relative; 0 for a sender we expect little from, which keeps a
    /// one-slot window) and gives the rest back to the system once senders
    /// have adopted their shares. Returns false when this transport cannot
    /// resize (nothing changes). Every process publishes, then (after a
    /// barrier) calls [`Endpoint::adopt_receive_shares`].
    fn publish_receive_shares(&mut self, weights: &[u64]) -> Result<bool, TransportError> {
        let _ = weights;
        Ok(false)
    }

    /// Starts using the shares the peers published for us (each sender
    /// switches its window once the peer has released all it sent).
    fn adopt_receive_shares(&mut self) {}

    /// Switches every window it can now; true while some still wait for the
    /// peer to release what we sent (keep polling).
    fn settle_receive_shares(&mut self) -> bool {
        false
    }

    /// Whether a large rendezvous should move in two halves at once (the
    /// receiver reads the first while the sender writes the second). Worth it
    /// where a read and a write proceed in parallel (two CPUs copying, two
    /// directions of a link); not where both queue on one byte stream (tcp).
    fn split_rendezvous(&self) -> bool {
        true
    }

    /// [`Endpoint::split_rendezvous`] toward `peer` (a transport that reaches
    /// peers through different endpoints answers for the one serving `peer`).
    fn split_rendezvous_to(&self, peer: PeerId) -> bool {
        let _ = peer;
        self.split_rendezvous()
    }

    /// How messages above the eager limit move, in words (benchmarks print it).
    fn large_message_path(&self) -> String {
        "one-sided read of the sender's buffer".into()
    }

    /// Registers memory the caller owns and keeps until
    /// [`Endpoint::deregister_owned`] (a registered buffer): operations on it
    /// then need no registration of their own. Transports without
    /// registration do nothing.
    fn register_owned(&mut self, region: &[u8]) -> Result<(), TransportError> {
        let _ = region;
        Ok(())
    }

    /// Ends the registration of a region given to [`Endpoint::register_owned`],
    /// before its memory is freed.
    fn deregister_owned(&mut self, region: &[u8]) {
        let _ = region;
    }

    /// Counts of registrations, for tests and reports.
    fn registration_stats(&self) -> RegistrationStats {
        RegistrationStats::default()
    }

    /// Announces that this process sends nothing more (peers see
    /// [`PeerState::Finalized`]) and releases transport resources.
    fn finalize(&mut self) -> Result<(), TransportError>;
}
