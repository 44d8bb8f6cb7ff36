//! Lending borrowed buffers to operations that outlive a single call.
//!
//! A non-blocking receive must write into the user's buffer later, during
//! some other library call. Handing raw pointers around would make that
//! sound only if the user never leaks a request (`mem::forget` defeats a
//! `Drop` that waits). Instead, buffers are lent inside a [`lend_scope`],
//! like `std::thread::scope`: the buffer's borrow lasts for `'env`, which
//! outlives the scope, and every handle lent in the scope is retired when the
//! scope ends (normally or by unwinding), after which [`LendTable::get`]
//! answers `None`. The core completes or cancels every operation before it
//! leaves the scope; a stale handle can never reach freed memory.

use std::cell::RefCell;
use std::marker::PhantomData;

/// A handle to a lent buffer: an index and a generation, `Copy`, harmless if lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lent {
    idx: u32,
    generation: u32,
}

#[derive(Debug)]
struct Slot {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    live: bool,
    generation: u32,
    epoch: u32,
    /// Lent by its owner ([`LendTable::lend_owned`]): no scope retires it.
    owned: bool,
    /// The slot its scope lent before this one ([`NONE`]: the first).
    next: u32,
}

/// The end of a scope's list of slots.
const NONE: u32 = u32::MAX;

/// The table of lent buffers. Lives beside the engine that uses it.
#[derive(Debug, Default)]
pub struct LendTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    epoch: u32,
    /// The open scopes (innermost last), each with the last slot it lent:
    /// the slots a scope lent form a list through `Slot::next`, so ending a
    /// scope costs what it lent, not the whole table (a blocking call inside
    /// a scope with 10^4 pending receives must not scan them).
    open: Vec<(u32, u32)>,
}

// SAFETY: the raw pointers in the table are only dereferenced through `get`/`get_mut`,
// which hand out references bounded by a borrow of the table; the table is moved
// between threads only as a whole (a progress thread owning the engine), and the
// buffers were lent as `&'env [u8]`/`&'env mut [u8]` with `'env` outliving the scope
// that retires them, so no thread can observe them after their borrow ends.
unsafe impl Send for LendTable {}

impl LendTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    fn insert(&mut self, ptr: *mut u8, len: usize, writable: bool, epoch: u32) -> Lent {
        let lent = self.insert_slot(ptr, len, writable, epoch);
        // Usually the innermost scope; an outer one may lend from inside an inner one.
        if let Some((_, last)) = self.open.iter_mut().rev().find(|(e, _)| *e == epoch) {
            self.slots[lent.idx as usize].next = *last;
            *last = lent.idx;
        }
        lent
    }

    #[inline]
    fn insert_slot(&mut self, ptr: *mut u8, len: usize, writable: bool, epoch: u32) -> Lent {
        if let Some(idx) = self.free.pop() {
            let s = &mut self.slots[idx as usize];
            s.ptr = ptr;
            s.len = len;
            s.writable = writable;
            s.live = true;
            s.epoch = epoch;
            s.owned = false;
            s.next = NONE;
            Lent { idx, generation: s.generation }
        } else {
            let idx = self.slots.len() as u32;
            self.slots.push(Slot { ptr, len, writable, live: true, generation: 0, epoch, owned: false, next: NONE });
            Lent { idx, generation: 0 }
        }
    }

    fn slot(&self, l: Lent) -> Option<&Slot> {
        self.slots.get(l.idx as usize).filter(|s| s.live && s.generation == l.generation)
    }

    /// Length of a live lent buffer.
    pub fn len_of(&self, l: Lent) -> Option<usize> {
        self.slot(l).map(|s| s.len)
    }

    /// The lent buffer, while its scope lasts.
    pub fn get(&self, l: Lent) -> Option<&[u8]> {
        let s = self.slot(l)?;
        // SAFETY: the slot is live, so the scope that lent it has not ended and the
        // borrow `&'env [u8]` (or `&'env mut`) it came from is still held by the scope;
        // ptr/len came from that slice. The returned reference is bounded by `&self`,
        // and mutable access (`get_mut`) needs `&mut self`, so they never overlap.
        Some(unsafe { std::slice::from_raw_parts(s.ptr, s.len) })
    }

    /// The lent buffer for writing; `None` if it was lent read-only or has been retired.
    pub fn get_mut(&mut self, l: Lent) -> Option<&mut [u8]> {
        let s = self.slot(l)?;
        if !s.writable {
            return None;
        }
        // SAFETY: as in `get`; moreover the buffer was lent from a `&'env mut [u8]`
        // (writable), which the scope holds exclusively, and the returned reference
        // is bounded by `&mut self`, so no other reference to it exists meanwhile.
        Some(unsafe { std::slice::from_raw_parts_mut(s.ptr, s.len) })
    }

    /// Lends memory its caller owns (a persistent operation's buffers) until
    /// [`LendTable::retire`]; scopes never retire it.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay allocated, and must not be read or written
    /// other than through this table (writable) or written at all (read-only),
    /// until `retire` is called with the returned handle.
    pub unsafe fn lend_owned(&mut self, ptr: *mut u8, len: usize, writable: bool) -> Lent {
        let l = self.insert_slot(ptr, len, writable, 0);
        self.slots[l.idx as usize].owned = true;
        l
    }

    /// Ends a [`LendTable::lend_owned`] loan (a no-op for a stale handle).
    pub fn retire(&mut self, l: Lent) {
        let Some(s) = self.slots.get_mut(l.idx as usize).filter(|s| s.live && s.owned && s.generation == l.generation) else {
            return;
        };
        s.live = false;
        s.generation = s.generation.wrapping_add(1);
        s.ptr = std::ptr::null_mut();
        self.free.push(l.idx);
    }

    #[inline]
    fn open_scope(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        self.open.push((self.epoch, NONE));
        self.epoch
    }

    #[inline]
    fn retire_epoch(&mut self, epoch: u32) {
        // Usually the innermost scope ends.
        let mut i = match self.open.last() {
            Some(&(e, last)) if e == epoch => {
                self.open.pop();
                last
            }
            _ => match self.open.iter().rposition(|(e, _)| *e == epoch) {
                Some(at) => self.open.remove(at).1,
                None => return,
            },
        };
        // Every slot on the list is still this scope's: only its end frees them.
        while i != NONE {
            let s = &mut self.slots[i as usize];
            let next = s.next;
            if s.live && !s.owned && s.epoch == epoch {
                s.live = false;
                s.generation = s.generation.wrapping_add(1);
                s.ptr = std::ptr::null_mut();
                self.free.push(i);
            }
            i = next;
        }
    }

    /// Number of buffers currently lent.
    pub fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.live).count()
    }
}

/// Lends buffers that live at least as long as `'env` for the duration of one scope.
pub struct Lender<'scope, 'env: 'scope> {
    table: &'scope RefCell<LendTable>,
    epoch: u32,
    // Covariant in 'scope (a lender may be seen for a shorter time; handles carry
    // no lifetime), invariant in 'env (buffers must outlive the whole scope).
    _scope: PhantomData<&'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'env> Lender<'_, 'env> {
    /// Lends `buf` for reading until the scope ends.
    pub fn lend(&self, buf: &'env [u8]) -> Lent {
        self.table.borrow_mut().insert(buf.as_ptr().cast_mut(), buf.len(), false, self.epoch)
    }

    /// Lends `buf` for reading and writing until the scope ends.
    pub fn lend_mut(&self, buf: &'env mut [u8]) -> Lent {
        self.table.borrow_mut().insert(buf.as_mut_ptr(), buf.len(), true, self.epoch)
    }
}

struct RetireOnExit<'a> {
    table: &'a RefCell<LendTable>,
    epoch: u32,
}

impl Drop for RetireOnExit<'_> {
    #[inline]
    fn drop(&mut self) {
        // Never panic in drop: if the table is borrowed (a panic inside a borrow),
        // retire through a fresh try; the slots would otherwise stay valid, so abort.
        match self.table.try_borrow_mut() {
            Ok(mut t) => t.retire_epoch(self.epoch),
            Err(_) => std::process::abort(),
        }
    }
}

/// Runs `f` with a [`Lender`]; every buffer lent through it is retired when
/// `f` returns or unwinds. Scopes nest.
pub fn lend_scope<'env, R>(table: &RefCell<LendTable>, f: impl for<'scope> FnOnce(&'scope Lender<'scope, 'env>) -> R) -> R {
    let epoch = table.borrow_mut().open_scope();
    let _guard = RetireOnExit { table, epoch };
    let lender = Lender { table, epoch, _scope: PhantomData, _env: PhantomData };
    f(&lender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_die_with_their_scope() {
        let table = RefCell::new(LendTable::new());
        let mut a = vec![1u8, 2, 3];
        let b = vec![9u8; 4];
        let (la, lb) = lend_scope(&table, |s| {
            let la = s.lend_mut(&mut a);
            let lb = s.lend(&b);
            table.borrow_mut().get_mut(la).unwrap()[0] = 7;
            assert_eq!(table.borrow().get(lb).unwrap(), &[9, 9, 9, 9]);
            assert!(table.borrow_mut().get_mut(lb).is_none(), "read-only lend is not writable");
            (la, lb)
        });
        assert!(table.borrow().get(la).is_none());
        assert!(table.borrow().get(lb).is_none());
        assert_eq!(table.borrow().live(), 0);
        assert_eq!(a, [7, 2, 3]);
    }

    #[test]
    fn an_outer_scope_lending_inside_an_inner_one_keeps_its_loans() {
        let table = RefCell::new(LendTable::new());
        let bufs: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i]).collect();
        lend_scope(&table, |outer| {
            let parked: Vec<Lent> = bufs[..50].iter().map(|b| outer.lend(b)).collect();
            let (inner_own, outer_late) = lend_scope(&table, |inner| {
                let own: Vec<Lent> = bufs[50..90].iter().map(|b| inner.lend(b)).collect();
                // The outer scope lends while the inner one is open.
                let late: Vec<Lent> = bufs[90..].iter().map(|b| outer.lend(b)).collect();
                (own, late)
            });
            assert!(inner_own.iter().all(|&l| table.borrow().get(l).is_none()), "the inner scope's loans end with it");
            for (l, want) in parked.iter().chain(&outer_late).zip((0..50u8).chain(90..100)) {
                assert_eq!(table.borrow().get(*l), Some(&[want][..]), "an outer loan outlives the inner scope");
            }
            assert_eq!(table.borrow().live(), 60);
        });
        assert_eq!(table.borrow().live(), 0);
    }

    #[test]
    fn nested_scopes_retire_only_their_own() {
        let table = RefCell::new(LendTable::new());
        let outer_buf = vec![1u8];
        let inner_buf = vec![2u8];
        lend_scope(&table, |outer| {
            let lo = outer.lend(&outer_buf);
            let li = lend_scope(&table, |inner| inner.lend(&inner_buf));
            assert!(table.borrow().get(li).is_none());
            assert_eq!(table.borrow().get(lo), Some(&[1u8][..]));
            // the slot of the retired inner handle is reused with a new generation
            let lo2 = outer.lend(&inner_buf);
            assert!(table.borrow().get(li).is_none());
            assert_eq!(table.borrow().get(lo2), Some(&[2u8][..]));
        });
    }

    #[test]
    fn unwinding_retires() {
        let table = RefCell::new(LendTable::new());
        let buf = vec![0u8; 8];
        let mut kept = None;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lend_scope(&table, |s| {
                kept = Some(s.lend(&buf));
                panic!("user code failed");
            })
        }));
        assert!(r.is_err());
        assert!(table.borrow().get(kept.unwrap()).is_none());
    }

    #[test]
    fn owned_loans_outlive_scopes_until_retired() {
        let table = RefCell::new(LendTable::new());
        let mut owned = vec![5u8; 3];
        // SAFETY: `owned` is not touched until the handle is retired below.
        let l = unsafe { table.borrow_mut().lend_owned(owned.as_mut_ptr(), owned.len(), true) };
        lend_scope(&table, |s| {
            let _ = s.lend(&[1u8]);
        });
        table.borrow_mut().get_mut(l).unwrap()[1] = 9;
        table.borrow_mut().retire(l);
        assert!(table.borrow().get(l).is_none());
        assert_eq!(table.borrow().live(), 0);
        assert_eq!(owned, [5, 9, 5]);
    }
}
