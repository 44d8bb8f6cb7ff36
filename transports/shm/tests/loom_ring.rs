//! A loom model of the shared-memory transport's memory ordering (issue 16
//! item 4): the slot ring (`ring.rs`: the sender writes header and payload
//! with plain stores, then release-stores the slot's sequence word; the
//! receiver acquire-loads it, then reads) and the credit words (through the
//! mailbox: the receiver release-stores how many slots it has released; the
//! sender acquire-loads it before reusing a slot).
//!
//! Loom runs every interleaving (and the weak-memory outcomes it models) of
//! one sender and one receiver moving three messages through one and two
//! slots, and reports a race on a slot's bytes if the orderings did not make
//! the receiver's read happen after the sender's write, and the sender's
//! reuse after the receiver's read. The same model with `Relaxed` orderings
//! must be caught (`relaxed_orderings_are_caught`), so the model has teeth.
//! Run by `scripts/test-all`:
//! `RUSTFLAGS="--cfg loom" cargo test -p fmx-shm --test loom_ring --release`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;

const MESSAGES: u64 = 3;

struct Shared {
    /// Each slot's payload (the bytes `TxRing::write` copies with plain stores).
    payload: Vec<UnsafeCell<u64>>,
    /// Each slot's sequence word: message index + 1 once published.
    seq: Vec<AtomicU64>,
    /// The mailbox credit word: slots the receiver has released.
    released: AtomicU64,
}

fn model(slots: usize, publish: Ordering, observe: Ordering) {
    loom::model(move || {
        let sh = Arc::new(Shared {
            payload: (0..slots).map(|_| UnsafeCell::new(0)).collect(),
            seq: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            released: AtomicU64::new(0),
        });
        let tx = sh.clone();
        let sender = loom::thread::spawn(move || {
            for i in 0..MESSAGES {
                // A credit for slot i % slots: the receiver released message i - slots.
                while tx.released.load(observe) + slots as u64 <= i {
                    loom::thread::yield_now();
                }
                let s = (i % slots as u64) as usize;
                // SAFETY: the model's claim: the credit says the receiver is done with this slot.
                tx.payload[s].with_mut(|p| unsafe { *p = 1000 + i });
                tx.seq[s].store(i + 1, publish);
            }
        });
        for i in 0..MESSAGES {
            let s = (i % slots as u64) as usize;
            while sh.seq[s].load(observe) != i + 1 {
                loom::thread::yield_now();
            }
            // SAFETY: the model's claim: the sequence word says the sender published this slot.
            let v = sh.payload[s].with(|p| unsafe { *p });
            assert_eq!(v, 1000 + i, "message {i} read from slot {s}");
            sh.released.store(i + 1, publish);
        }
        sender.join().unwrap();
    });
}

#[test]
fn release_acquire_orders_slots_and_credits_one_slot() {
    model(1, Ordering::Release, Ordering::Acquire);
}

#[test]
fn release_acquire_orders_slots_and_credits_two_slots() {
    model(2, Ordering::Release, Ordering::Acquire);
}

#[test]
#[should_panic]
fn relaxed_orderings_are_caught() {
    model(1, Ordering::Relaxed, Ordering::Relaxed);
}
