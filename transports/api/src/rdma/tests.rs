//! The shared RDMA core over a device made of memory: two endpoints in one
//! process, whose "device" moves eager messages through queues, credit words
//! into the peer's mailbox and one-sided pieces by copying. What is checked
//! is the core's part, the same for verbs and libfabric: FM's send rule and
//! credits through the `Endpoint` every device gets, pieces that wait for
//! room instead of spinning, and finalize seen through the mailbox.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::sealed::{Core, Sealed};

const CORE: Core = Core(());
use super::*;
use crate::ops::{Operations, Piece};
use crate::peers::Peer;
use crate::{Arrival, Endpoint, MsgHeader, MsgKind, OpStatus, PeerId, PeerState, RemoteKey, SendOutcome, TransportError};

/// Receive slots of each endpoint, and their size.
const RECV_SLOTS: u64 = 16;
const SLOT_BYTES: usize = 256;

/// Messages in flight to each rank: (sender, header and payload).
type Wires = Arc<Mutex<Vec<VecDeque<(PeerId, Vec<u8>)>>>>;

struct MemoryDevice {
    st: RdmaState<()>,
    wires: Wires,
    /// Where each rank's mailbox lives.
    mailboxes: Arc<Mutex<Vec<usize>>>,
    ops: Operations<Local<Plain>, ()>,
    memory: Memory<PlainHook>,
    /// Pieces the device takes before it answers "again".
    room: usize,
    /// The most messages that ever waited for one receiver.
    deepest: Arc<Mutex<usize>>,
    next_slot: u64,
}

/// A registration of memory that needs none: the address is the key.
struct Plain {
    base: u64,
    len: usize,
}

impl Region for Plain {
    fn start(&self) -> u64 {
        self.base
    }
    fn covers(&self, addr: u64, len: usize) -> bool {
        addr >= self.base && addr + len as u64 <= self.base + self.len as u64
    }
}

impl Registration for Plain {
    type Desc = ();
    const NO_DESC: () = ();
    fn desc(&self) {}
    fn remote_key(&self) -> u64 {
        1
    }
    fn remote_addr(&self, addr: u64) -> u64 {
        addr
    }
}

struct PlainHook;

impl crate::pool::RegistrationHook for PlainHook {
    type Handle = Plain;
    fn register(&mut self, chunk: &mut [u8]) -> Result<Plain, TransportError> {
        Ok(Plain { base: chunk.as_ptr() as u64, len: chunk.len() })
    }
    fn deregister(&mut self, _: Plain) {}
}

impl Sealed for MemoryDevice {}

impl RdmaDevice for MemoryDevice {
    type Link = ();
    type Desc = ();
    type Mr = Plain;
    type Hook = PlainHook;

    fn state(&self) -> &RdmaState<()> {
        &self.st
    }
    fn state_mut(&mut self, _: Core) -> &mut RdmaState<()> {
        &mut self.st
    }
    fn send_eager(
        &mut self,
        _: Core,
        peer: PeerId,
        header: &[u8; crate::HEADER_BYTES],
        payload: &[u8],
    ) -> Result<SendOutcome, TransportError> {
        let mut wires = self.wires.lock().expect("wires");
        wires[peer as usize].push_back((self.st.rank, [&header[..], payload].concat()));
        let mut deepest = self.deepest.lock().expect("depth");
        *deepest = (*deepest).max(wires[peer as usize].len());
        Ok(SendOutcome::Sent)
    }
    fn receive(&mut self, _: Core, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        let mut n = 0;
        while n < max {
            let Some((peer, bytes)) = self.wires.lock().expect("wires")[self.st.rank as usize].pop_front() else { break };
            // Slots in turn: at most a slice and the control slots are held at once.
            let slot = self.next_slot % RECV_SLOTS;
            self.next_slot += 1;
            self.st.recv[slot as usize * SLOT_BYTES..][..bytes.len()].copy_from_slice(&bytes);
            let a = self.st.arrive(peer, slot, bytes.len(), "undecodable header in memory")?;
            if RdmaState::<()>::for_core(&a) {
                out.push(a);
                n += 1;
            } else {
                self.release_slot(CORE, a)?;
            }
        }
        Ok(n)
    }
    fn post_slots(&mut self, _: Core, _peer: PeerId, _slots: std::ops::Range<usize>) -> Result<(), TransportError> {
        Ok(()) // every slot of this device is always there
    }
    fn release_slot(&mut self, _: Core, arrival: Arrival) -> Result<(), TransportError> {
        self.st.unhold(&arrival)?;
        self.st.released(arrival.peer, crate::credit::Class::of(arrival.header.kind));
        Ok(())
    }
    fn large_path(&self) -> String {
        "a copy in memory".into()
    }
    fn memory(&mut self, _: Core) -> &mut Memory<PlainHook> {
        &mut self.memory
    }
    fn register(&mut self, _: Core, _peer: PeerId, ptr: *const u8, len: usize, _access: Access) -> Result<Plain, TransportError> {
        Ok(Plain { base: ptr as u64, len })
    }
    fn operations(&mut self, _: Core) -> &mut Operations<Local<Plain>, ()> {
        &mut self.ops
    }
    fn max_piece(&self) -> usize {
        4
    }
    fn post_piece(&mut self, _: Core, pc: &Piece<()>) -> Result<Posted, TransportError> {
        if self.room == 0 {
            return Ok(Posted::Again);
        }
        self.room -= 1;
        let (from, to) = if pc.read { (pc.remote_addr, pc.local) } else { (pc.local, pc.remote_addr) };
        // SAFETY: both ranges lie in buffers of this test that outlive the
        // operation (the remote one exposed, the local one lent until poll_ops).
        unsafe { std::ptr::copy(from as *const u8, to as *mut u8, pc.len) };
        self.ops.piece_done(pc.op, None);
        Ok(Posted::Yes)
    }
    fn progress(&mut self, _: Core) -> Result<(), TransportError> {
        Ok(())
    }
    fn return_credits(&mut self, _: Core, all: bool) -> Result<(), TransportError> {
        self.st.explicit_due = false;
        for peer in self.st.owed_returns(all) {
            let word = self.st.return_word(peer);
            let base = self.mailboxes.lock().expect("mailboxes")[peer as usize];
            // SAFETY: the peer's mailbox map lives as long as the pair (both
            // endpoints drop together) and holds a word for every rank.
            let slot = unsafe { &*(base as *const AtomicU64).add(self.st.rank as usize) };
            slot.store(word, Ordering::Release);
        }
        Ok(())
    }
    fn probe(&mut self, _: Core, _peer: PeerId) {}
    fn words_in_flight(&mut self, _: Core) -> bool {
        false
    }
}

/// Two endpoints: pool of 8 slots, newcomer credits 2, a return after 1.
fn pair() -> (MemoryDevice, MemoryDevice, Arc<Mutex<usize>>) {
    let wires: Wires = Arc::new(Mutex::new(vec![VecDeque::new(), VecDeque::new()]));
    let mailboxes = Arc::new(Mutex::new(vec![0; 2]));
    let deepest = Arc::new(Mutex::new(0));
    let make = |rank: u32| {
        let cfg =
            EagerConfig { rank, size: 2, pool: 8, slot_bytes: SLOT_BYTES, newcomer: 2, threshold: Some(1), connect: None, conn_slots: 8 };
        let mailbox = memmap2::MmapMut::map_anon(16).expect("a mailbox");
        mailboxes.lock().expect("mailboxes")[rank as usize] = mailbox.as_ptr() as usize;
        let recv = memmap2::MmapMut::map_anon(RECV_SLOTS as usize * SLOT_BYTES).expect("receive slots");
        let mut st = RdmaState::new(&cfg, cfg.credits().expect("credits"), Arc::default(), mailbox, recv);
        let host = crate::liveness::host_identity();
        let peer = Peer {
            credits: crate::credit::PeerCredits::new(&st.credit, 1 - rank < rank),
            life: crate::liveness::PeerLife::new(std::process::id(), &host, &host),
            mailbox_addr: 0,
            mailbox_key: 0,
            link: (),
        };
        let mut peers = vec![None, None];
        peers[1 - rank as usize] = Some(peer);
        st.set_peers(peers);
        MemoryDevice {
            st,
            wires: wires.clone(),
            mailboxes: mailboxes.clone(),
            ops: Operations::default(),
            memory: Memory::new(PlainHook, 0, false),
            room: usize::MAX,
            deepest: deepest.clone(),
            next_slot: 0,
        }
    };
    (make(0), make(1), deepest)
}

fn header(n: u64) -> MsgHeader {
    MsgHeader { kind: MsgKind::Eager, credits: 0, ctrl_credits: 0, payload_len: 0, match_bits: n, len: 0, cookie: 0 }
}

fn drain(ep: &mut MemoryDevice) -> Vec<(PeerId, u64, Vec<u8>)> {
    let mut got = Vec::new();
    ep.poll(64, |p, h, b| got.push((p, h.match_bits, b.to_vec()))).expect("poll");
    got
}

#[test]
fn connections_list_each_installed_peer_once_with_when_it_was_made() {
    let before = std::time::Instant::now();
    let (a, b, _) = pair();
    for (ep, other) in [(&a, 1), (&b, 0)] {
        let c = Endpoint::connections(ep);
        assert_eq!(c.iter().map(|c| c.peer).collect::<Vec<_>>(), vec![other], "rank {} connects to its one peer only", ep.st.rank);
        assert!(c[0].made_at >= before && c[0].made_at <= std::time::Instant::now(), "made during the set-up: {c:?}");
    }
}

#[test]
fn the_send_rule_and_credits_bound_what_waits_at_a_receiver() {
    let (mut a, mut b, deepest) = pair();
    // FM's send rule: the lower rank waits until the higher one has sent.
    assert_eq!(a.try_send(1, &header(0), b"x").expect("send"), SendOutcome::NotAllowed);
    let mut sent = 0;
    while b.try_send(0, &header(sent), &[sent as u8; 3]).expect("send") == SendOutcome::Sent {
        sent += 1;
    }
    assert_eq!(sent, 2, "a newcomer sends its two credits, then meets backpressure");
    assert_eq!(*deepest.lock().expect("depth"), 2);
    let got = drain(&mut a);
    assert_eq!(got, vec![(1, 0, vec![0; 3]), (1, 1, vec![1; 3])], "in order, with their payloads");
    // a returned the two slots through b's mailbox; b sends again, and a may answer now.
    assert_eq!(b.try_send(0, &header(2), b"again").expect("send"), SendOutcome::Sent);
    assert_eq!(a.try_send(1, &header(9), b"reply").expect("send"), SendOutcome::Sent);
    assert_eq!(drain(&mut b), vec![(0, 9, b"reply".to_vec())]);
    for n in 0..200 {
        while b.try_send(0, &header(n), b"stream").expect("send") != SendOutcome::Sent {
            drain(&mut a);
        }
    }
    drain(&mut a);
    assert_eq!(*deepest.lock().expect("depth"), 2, "never more than b's credits wait at a");
    // Once the job's shape is known, b gets a's whole slice (8 slots) through its mailbox.
    a.reallocate_credits().expect("reallocate");
    b.reallocate_credits().expect("reallocate");
    let mut burst = 0;
    while b.try_send(0, &header(burst), b"burst").expect("send") == SendOutcome::Sent {
        burst += 1;
    }
    assert_eq!(burst, 8);
    assert_eq!(drain(&mut a).len(), 8);
}

#[test]
fn pieces_wait_for_room_and_an_operation_reports_once_all_moved() {
    let (mut a, mut b, _) = pair();
    let mut exposed = (0u8..10).collect::<Vec<u8>>();
    // SAFETY: `exposed` outlives the read below and is not touched until the revoke.
    let key = unsafe { a.expose_mut(&mut exposed) }.expect("expose");
    let mut local = vec![0u8; 10];
    b.room = 1;
    // SAFETY: `local` stays alive and untouched until poll_ops reports the read.
    let id = match unsafe { b.read(0, &key, &mut local) }.expect("read") {
        OpStatus::Pending(id) => id,
        OpStatus::Done => panic!("10 bytes in pieces of 4 cannot be done at once"),
    };
    let mut done = Vec::new();
    b.poll_ops(|id, r| done.push((id, r.is_ok()))).expect("poll_ops");
    assert!(done.is_empty(), "two pieces wait for room; nothing is reported");
    b.room = usize::MAX;
    b.poll_ops(|id, r| done.push((id, r.is_ok()))).expect("poll_ops");
    assert_eq!(done, vec![(id, true)]);
    assert_eq!(local, (0u8..10).collect::<Vec<u8>>());
    let out = [7u8; 6];
    // SAFETY: `out` outlives the write, reported before the assertions below.
    let id = match unsafe { b.write(0, &out, &key.slice(0, 2, 6).expect("in bounds")) }.expect("write") {
        OpStatus::Pending(id) => id,
        OpStatus::Done => panic!("pieces go through the device"),
    };
    done.clear();
    b.poll_ops(|id, r| done.push((id, r.is_ok()))).expect("poll_ops");
    assert_eq!(done, vec![(id, true)]);
    a.revoke(&key);
    assert_eq!(exposed, [0, 1, 7, 7, 7, 7, 7, 7, 8, 9]);
}

#[test]
fn bad_input_is_named_and_finalize_is_seen_through_the_mailbox() {
    let (mut a, mut b, _) = pair();
    assert!(matches!(b.try_send(0, &header(0), &[0; 300]), Err(TransportError::EagerTooLarge { len: 300, max: 224 })));
    assert!(matches!(b.try_send(5, &header(0), b""), Err(TransportError::NoSuchPeer { peer: 5, size: 2 })));
    let key = RemoteKey { addr: 0, len: 4, key: 1 };
    let mut local = [0u8; 8];
    // SAFETY: refused before anything moves: the range is outside the key.
    let refused = unsafe { b.read(0, &key, &mut local) };
    assert!(matches!(refused, Err(TransportError::RemoteBounds { peer: 0, len: 8, region: 4, .. })));
    // A message stays in its slot until released, once: a second release
    // (which would give the sender a credit twice) is refused.
    assert_eq!(b.try_send(0, &header(4), b"held").expect("send"), SendOutcome::Sent);
    let mut got = Vec::new();
    assert_eq!(a.arrivals(8, &mut got).expect("arrivals"), 1);
    let held = got.pop().expect("one arrival");
    assert_eq!(a.payload(&held), b"held");
    let copy = Arrival { peer: held.peer, header: held.header, slot: held.slot, len: held.len };
    a.release(held).expect("release");
    assert_eq!(a.payload(&copy), b"", "a released slot is not read");
    assert!(matches!(a.release(copy), Err(TransportError::Unsupported(m)) if m.contains("does not hold")));
    assert_eq!(a.peer_state(1), PeerState::Alive);
    b.finalize().expect("finalize");
    assert_eq!(b.peer_state(1), PeerState::Finalized, "we know our own state");
    assert_eq!(a.peer_state(1), PeerState::Finalized, "b's last word says it finalized");
    assert_eq!(a.peer_state(7), PeerState::Dead, "not in the job");
}
