//! The `Endpoint` of every RDMA device: the parts that are the same on all
//! of them, over [`RdmaDevice`].

use std::time::{Duration, Instant};

use super::connect::{CONNECT_ACCEPT, CONNECT_REQUEST};
use super::memory::{Access, Memory, Path};
use super::sealed::Core;
use super::{Admit, Posted, RdmaDevice};
use crate::own::OWN_SLOT;
use crate::{
    Arrival, Endpoint, MsgHeader, MsgKind, OpStatus, PeerId, PeerState, ReceiveMemory, RegistrationStats, RemoteKey, SendOutcome,
    TransportError,
};

/// The token the core passes to the device.
const CORE: Core = Core(());

/// How long finalize waits for its last credit words to leave.
const FINALIZE_WAIT: Duration = Duration::from_secs(2);

/// `Endpoint::peer_state`.
fn shared_peer_state<D: RdmaDevice>(d: &mut D, peer: PeerId) -> PeerState {
    let st = d.state_mut(CORE);
    if peer == st.rank {
        return if st.finalized { PeerState::Finalized } else { PeerState::Alive };
    }
    if peer >= st.size {
        return PeerState::Dead;
    }
    let _ = d.progress(CORE); // completions may tell that it is gone
    let st = d.state_mut(CORE);
    if let Some(state) = st.peers.departed(&st.mailbox, peer) {
        return state;
    }
    // Another host: a failed probe marks it dead. One more peer is probed per
    // check, in turn: a wait on the ranks of a lost node finds them all dead
    // within one probe timeout, not one after another. Lazily, only connected
    // peers are probed: a probe would open a connection of its own (the
    // launcher reports a lost process that we never spoke with).
    if st.reachable(peer) {
        d.probe(CORE, peer);
    }
    let st = d.state_mut(CORE);
    let other = st.probe_cursor % st.size;
    st.probe_cursor = other + 1;
    if other != st.rank && other != peer && st.reachable(other) && st.peers.departed(&st.mailbox, other).is_none() {
        d.probe(CORE, other);
    }
    PeerState::Alive
}

/// `Endpoint::reallocate_credits`: once, every (connected) peer gets its share.
fn shared_reallocate_credits<D: RdmaDevice>(d: &mut D) -> Result<(), TransportError> {
    let st = d.state_mut(CORE);
    if st.reallocated {
        return Ok(());
    }
    st.reallocate();
    d.return_credits(CORE, true)
}

/// Lazily, the data message toward a larger ID that has not spoken to us is
/// refused by FM's rule: that is "connecting". The first such refusal sends
/// the connect request (in the control reserve, which the rule does not
/// close); the peer's answer opens the way. `Endpoint::preconnect` sends one
/// toward any ID (a smaller one answers it alike).
fn shared_request_connection<D: RdmaDevice + Send>(d: &mut D, peer: PeerId) -> Result<(), TransportError> {
    if !d.state().conns.wants_request(peer) {
        return Ok(());
    }
    let request = MsgHeader::control(MsgKind::Internal, CONNECT_REQUEST, 0, 0, 0);
    if d.try_send(peer, &request, &[])? == SendOutcome::Sent {
        d.state_mut(CORE).conns.requested(peer);
    }
    Ok(())
}

/// Answers the connect requests that arrived: the answer carries our grant
/// (FM's newcomer credits and, once the job's shape is known, the slice).
fn shared_accept_connections<D: RdmaDevice + Send>(d: &mut D) -> Result<(), TransportError> {
    let due = d.state_mut(CORE).conns.take_accepts();
    let accept = MsgHeader::control(MsgKind::Internal, CONNECT_ACCEPT, 0, 0, 0);
    for peer in due {
        match d.try_send(peer, &accept, &[]) {
            // Gone since its request: whatever waits on it is told by its liveness.
            Ok(SendOutcome::Sent) | Err(TransportError::PeerGone { .. }) => {}
            Ok(_) => d.state_mut(CORE).conns.accept_later(peer),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `Endpoint::finalize`: tells every peer, through its mailbox word, and
/// waits (bounded) until those words have left, since after our exit
/// the device would not send them.
fn shared_finalize<D: RdmaDevice>(d: &mut D) -> Result<(), TransportError> {
    if d.state_mut(CORE).finalized {
        return Ok(());
    }
    d.state_mut(CORE).finalized = true;
    let deadline = Instant::now() + FINALIZE_WAIT;
    loop {
        d.progress(CORE)?;
        d.return_credits(CORE, true)?;
        if !d.state_mut(CORE).explicit_due || Instant::now() >= deadline {
            break;
        }
        std::thread::yield_now();
    }
    while d.words_in_flight(CORE) && Instant::now() < deadline {
        d.progress(CORE)?;
        std::thread::yield_now();
    }
    Ok(())
}

/// Posts the receive slots granted since the last call (a first contact grants them).
fn shared_post_granted<D: RdmaDevice>(d: &mut D) -> Result<(), TransportError> {
    if d.state().posts_due.is_empty() {
        return Ok(());
    }
    for (peer, slots) in d.state_mut(CORE).take_posts() {
        d.post_slots(CORE, peer, slots)?;
    }
    Ok(())
}

/// Starts a one-sided operation in pieces of at most [`RdmaDevice::max_piece`];
/// the pieces the device has no room for wait (never spinning) for the
/// next `Endpoint::poll_ops`.
///
/// # Safety
/// `local` is valid for `len` bytes (written for a read, read for a write)
/// until `poll_ops` reports the operation.
unsafe fn shared_one_sided<D: RdmaDevice>(
    d: &mut D,
    peer: PeerId,
    remote: &RemoteKey,
    local: *mut u8,
    len: usize,
    read: bool,
) -> Result<OpStatus, TransportError> {
    let remote = remote.slice(peer, 0, len as u64)?;
    d.state_mut(CORE).peers.alive(peer)?;
    if len == 0 {
        return Ok(OpStatus::Done);
    }
    // SAFETY: `local` is the caller's buffer of `len` bytes, valid until
    // `poll_ops` reports the operation (the promise of `Endpoint::read`/`write`),
    // which is when `finish_local` runs.
    let (base, desc, keep, path) = match unsafe { d.memory(CORE).local_side(local, len, read) }? {
        Some(side) => side,
        None => {
            let mr = d.register(CORE, peer, local, len, Memory::<D::Hook>::local_access(read))?;
            Memory::<D::Hook>::registered_local(local, mr)
        }
    };
    count(d, path);
    let piece = d.max_piece();
    let id = d.operations(CORE).start(peer, base, len, desc, &remote, read, piece, keep);
    shared_post_pending(d)?;
    Ok(OpStatus::Pending(id))
}

/// Posts queued pieces while the device takes them; a piece toward a
/// peer that is gone fails at once.
fn shared_post_pending<D: RdmaDevice>(d: &mut D) -> Result<(), TransportError> {
    d.before_posting(CORE)?;
    while let Some(pc) = d.operations(CORE).pop() {
        if let Some(reason) = d.state_mut(CORE).gone(pc.peer) {
            d.operations(CORE).piece_done(pc.op, Some(TransportError::PeerGone { peer: pc.peer, reason }));
            continue;
        }
        match d.post_piece(CORE, &pc) {
            Ok(Posted::Yes) => {}
            Ok(Posted::Again) => {
                d.operations(CORE).push_front(pc);
                return Ok(());
            }
            // Pieces already posted complete later; the operation reports this error then.
            Err(e) => d.operations(CORE).piece_done(pc.op, Some(e)),
        }
    }
    Ok(())
}

/// `Endpoint::poll_ops`: reads completions, posts what waits, and reports
/// every finished operation once its local side is ended.
fn shared_poll_ops<D: RdmaDevice, F>(d: &mut D, mut done: F) -> Result<usize, TransportError>
where
    F: FnMut(u64, Result<(), TransportError>),
{
    d.progress(CORE)?;
    shared_post_pending(d)?;
    let finished = d.operations(CORE).take_done();
    let n = finished.len();
    for f in finished {
        d.memory(CORE).finish_local(f.local, f.result.is_ok());
        d.operation_ended(CORE, f.id);
        done(f.id, f.result);
    }
    Ok(n)
}

/// Counts how the core came by memory for an operation or exposure.
fn count<D: RdmaDevice>(d: &mut D, path: Path) {
    let st = d.state_mut(CORE);
    match path {
        Path::Owned => st.stats.owned_hits += 1,
        Path::Bounced => st.stats.bounced += 1,
        Path::PerOp => st.count_per_operation(),
        Path::Plain => {}
    }
}

/// `Endpoint::expose` and `expose_mut`: the device's own protocol where it
/// has no RMA, else what [`Memory`] serves, else a registration for it.
///
/// # Safety
/// `ptr` is valid for `len` bytes (writable when `writable`) until the key is revoked.
unsafe fn shared_expose<D: RdmaDevice>(d: &mut D, ptr: *mut u8, len: usize, writable: bool) -> Result<RemoteKey, TransportError> {
    if let Some(key) = d.expose_without_rma(CORE, ptr, len, writable) {
        return key;
    }
    // SAFETY: the caller's promise, passed on: valid until `end_exposure`.
    let (key, path) = match unsafe { d.memory(CORE).expose(ptr, len, writable) }? {
        Some(served) => served,
        None => {
            let rank = d.state().rank;
            let mr = d.register(CORE, rank, ptr, len, Memory::<D::Hook>::exposure_access(writable))?;
            (d.memory(CORE).expose_registered(ptr, len, mr), Path::PerOp)
        }
    };
    count(d, path);
    Ok(key)
}

/// The endpoint every RDMA device is: the shared core with the device's parts.
impl<D: RdmaDevice + Send> Endpoint for D {
    fn local_id(&self) -> PeerId {
        self.state().rank
    }

    fn num_peers(&self) -> u32 {
        self.state().size
    }

    fn max_eager(&self) -> usize {
        self.state().max_eager()
    }

    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        let st = self.state_mut(CORE);
        let class = match st.admit(peer, header, payload)? {
            Admit::Answer(SendOutcome::NotAllowed) => {
                shared_request_connection(self, peer)?;
                return Ok(SendOutcome::NotAllowed);
            }
            Admit::Answer(outcome) => return Ok(outcome),
            Admit::Go(class) => class,
        };
        // The credit and the piggybacked returns count only if the send goes out.
        let saved = st.peers.alive(peer)?.credits.clone();
        let wire = st.take_credit(peer, class, header)?;
        let out = self.send_eager(CORE, peer, &wire, payload);
        if matches!(out, Ok(SendOutcome::Sent)) {
            self.state_mut(CORE).first_contact(peer);
            shared_post_granted(self)?;
        } else if let Some(Some(p)) = self.state_mut(CORE).peers.get_mut(peer as usize) {
            p.credits = saved;
        }
        out
    }

    fn credit(&mut self, peer: PeerId) -> SendOutcome {
        self.state_mut(CORE).credit(peer)
    }

    fn arrivals(&mut self, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        let st = self.state_mut(CORE);
        let rank = st.rank;
        let mut n = st.own.take(rank, max, out);
        n += self.receive(CORE, max - n, out)?;
        shared_post_granted(self)?;
        shared_accept_connections(self)?;
        shared_post_pending(self)?;
        if self.state().explicit_due {
            let news = std::mem::take(&mut self.state_mut(CORE).finalize_news);
            self.return_credits(CORE, news)?;
            // Not every word could go: the news stays due.
            let st = self.state_mut(CORE);
            st.finalize_news |= news && st.explicit_due;
        }
        Ok(n)
    }

    fn payload(&self, arrival: &Arrival) -> &[u8] {
        if arrival.slot & OWN_SLOT != 0 {
            return self.state().own.payload(arrival.slot);
        }
        self.state().payload(arrival)
    }

    fn release(&mut self, arrival: Arrival) -> Result<(), TransportError> {
        if arrival.slot & OWN_SLOT != 0 {
            if self.state_mut(CORE).own.release(arrival.slot) {
                return Ok(());
            }
            return Err(TransportError::Unsupported("releasing a message to ourselves that this endpoint does not hold".into()));
        }
        let peer = arrival.peer;
        self.release_slot(CORE, arrival)?;
        // At once, not at the next poll: the receiver may wait elsewhere now.
        if self.state().owes(peer) {
            self.return_credits(CORE, false)?;
        }
        Ok(())
    }

    unsafe fn expose(&mut self, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        // SAFETY: the caller keeps `buf` alive until the revoke; not
        // writable, so the region is only read through this pointer.
        unsafe { shared_expose(self, buf.as_ptr().cast_mut(), buf.len(), false) }
    }

    unsafe fn expose_mut(&mut self, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        // SAFETY: the caller keeps `buf` alive and untouched until the revoke.
        unsafe { shared_expose(self, buf.as_mut_ptr(), buf.len(), true) }
    }

    fn revoke(&mut self, key: &RemoteKey) {
        if !self.end_exposure_without_rma(CORE, key) {
            self.memory(CORE).end_exposure(key);
        }
    }

    unsafe fn read(&mut self, peer: PeerId, remote: &RemoteKey, local: &mut [u8]) -> Result<OpStatus, TransportError> {
        // SAFETY: the caller keeps `local` alive and untouched until `poll_ops` reports the read.
        unsafe { shared_one_sided(self, peer, remote, local.as_mut_ptr(), local.len(), true) }
    }

    unsafe fn write(&mut self, peer: PeerId, local: &[u8], remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        // SAFETY: the caller keeps `local` alive until `poll_ops` reports the
        // write, which only reads it: the pointer is not written through.
        unsafe { shared_one_sided(self, peer, remote, local.as_ptr().cast_mut(), local.len(), false) }
    }

    fn abandon(&mut self, why: &str) -> bool {
        self.abandon_operations(CORE, why)
    }

    fn poll_ops<F>(&mut self, done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        shared_poll_ops(self, done)
    }

    fn peer_state(&mut self, peer: PeerId) -> PeerState {
        shared_peer_state(self, peer)
    }

    fn reallocate_credits(&mut self) -> Result<(), TransportError> {
        shared_reallocate_credits(self)
    }

    fn receive_memory(&self) -> ReceiveMemory {
        self.state().receive_memory()
    }

    fn connections(&self) -> Vec<crate::Connection> {
        self.state().connections()
    }

    fn connects_on_demand(&self, peer: PeerId) -> bool {
        self.state().conns.lazy() && peer != self.state().rank
    }

    fn preconnect(&mut self, peer: PeerId) -> Result<bool, TransportError> {
        if !self.connects_on_demand(peer) || self.state().conns.is_made(peer) {
            return Ok(true);
        }
        shared_request_connection(self, peer)?;
        Ok(false)
    }

    fn split_rendezvous(&self) -> bool {
        self.splits_rendezvous()
    }

    fn large_message_path(&self) -> String {
        self.large_path()
    }

    fn register_owned(&mut self, region: &[u8]) -> Result<(), TransportError> {
        if region.is_empty() {
            return Ok(());
        }
        self.state().count_registration();
        let rank = self.state().rank;
        let mr = self.register(CORE, rank, region.as_ptr(), region.len(), Access::Any)?;
        self.memory(CORE).insert_owned(mr);
        Ok(())
    }

    fn deregister_owned(&mut self, region: &[u8]) {
        self.memory(CORE).remove_owned(region.as_ptr() as u64);
    }

    fn registration_stats(&self) -> RegistrationStats {
        self.state().registration_stats()
    }

    fn finalize(&mut self) -> Result<(), TransportError> {
        shared_finalize(self)
    }
}
