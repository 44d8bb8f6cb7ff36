//! FM-style active messages: a message names a handler on the receiver,
//! which runs when the receiver extracts.
//!
//! ```no_run
//! # fn main() -> Result<(), fmx::Error> {
//! let fmx = fmx::init()?;
//! let world = fmx.world();
//! let am = world.active_messages();
//! am.register(1, |msg, replies| {
//!     let mut x = [0u8; 8];
//!     msg.receive(&mut x);                    // pieces arrive in order
//!     replies.send(msg.sender(), 2, x.to_vec()); // queued if there is no credit
//! });
//! if let Some(mut s) = am.begin_message(1 % world.size(), 8, 1)? { // None: no credit now
//!     s.send_piece(&[1, 2, 3, 4])?;
//!     s.send_piece(&[5, 6, 7, 8])?;
//!     s.end_message()?;
//! }
//! am.extract(usize::MAX)?;                    // runs pending handlers
//! # Ok(()) }
//! ```
//!
//! Handlers may not block on the network: inside a handler every blocking
//! call of the communicator answers [`Error::InHandler`], and replies go
//! through [`Replies`], which queues them when there is no credit (FM's rule:
//! a handler never waits for credit). Sending never blocks: the engine owns
//! the message until it has gone (a large one until the receiver's extract
//! has read it).

use std::cell::RefCell;
use std::collections::HashMap;

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::status::{Source, Tag};

/// Active-message traffic of a communicator travels on its own context.
const AM_CONTEXT_BIT: u32 = 1 << 31;

type Handler = Box<dyn FnMut(&mut Incoming<'_>, &mut Replies)>;

/// The active-message endpoint of a communicator.
pub struct ActiveMessages<'c> {
    comm: &'c Comm,
    handlers: RefCell<HashMap<u32, Handler>>,
}

/// An incoming message, as its handler sees it.
pub struct Incoming<'a> {
    sender: u32,
    handler: u32,
    data: &'a [u8],
    pos: usize,
}

impl Incoming<'_> {
    /// The sender's rank in the communicator.
    pub fn sender(&self) -> u32 {
        self.sender
    }

    /// The handler id the message named.
    pub fn handler(&self) -> u32 {
        self.handler
    }

    /// Total length of the message.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Bytes not yet received.
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// Copies the next `buf.len()` bytes of the message (fewer at its end) into
    /// `buf`, in the order the sender sent its pieces; returns how many.
    pub fn receive(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.remaining());
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        n
    }
}

/// Messages a handler sends; they leave after it returns, queued when there is no credit.
#[derive(Debug, Default)]
pub struct Replies {
    queued: Vec<(u32, u32, Vec<u8>)>,
}

impl Replies {
    /// Sends `data` to handler `handler` of rank `dest`.
    pub fn send(&mut self, dest: u32, handler: u32, data: Vec<u8>) {
        self.queued.push((dest, handler, data));
    }
}

/// A message being sent piece by piece.
pub struct Stream<'a, 'c> {
    am: &'a ActiveMessages<'c>,
    dest: u32,
    handler: u32,
    len: usize,
    buf: Vec<u8>,
}

impl Stream<'_, '_> {
    /// Appends a piece; the pieces may not exceed the length given to `begin_message`.
    pub fn send_piece(&mut self, piece: &[u8]) -> Result<()> {
        if self.buf.len() + piece.len() > self.len {
            return Err(Error::InvalidCount {
                what: "send_piece",
                detail: format!("{} bytes sent plus a piece of {} exceed the message length {}", self.buf.len(), piece.len(), self.len),
            });
        }
        self.buf.extend_from_slice(piece);
        Ok(())
    }

    /// Sends the message; its pieces must add up to the length given to `begin_message`.
    pub fn end_message(self) -> Result<()> {
        if self.buf.len() != self.len {
            return Err(Error::InvalidCount {
                what: "end_message",
                detail: format!("pieces add up to {} bytes but the message was begun with {}", self.buf.len(), self.len),
            });
        }
        self.am.send_now(self.dest, self.handler, self.buf)
    }
}

impl Comm {
    /// The active-message endpoint of this communicator.
    pub fn active_messages(&self) -> ActiveMessages<'_> {
        ActiveMessages { comm: self, handlers: RefCell::new(HashMap::new()) }
    }

    fn am_ctx(&self) -> u32 {
        self.ctx | AM_CONTEXT_BIT
    }
}

impl<'c> ActiveMessages<'c> {
    /// Registers (or replaces) the handler for `id`.
    pub fn register(&self, id: u32, handler: impl FnMut(&mut Incoming<'_>, &mut Replies) + 'static) {
        self.handlers.borrow_mut().insert(id, Box::new(handler));
    }

    fn check(&self, dest: u32, handler: u32) -> Result<u32> {
        self.comm.sh.check_live("begin_message")?;
        Comm::check_tag(handler as i32)
            .map_err(|_| Error::InvalidCount { what: "handler id", detail: format!("{handler} is above {}", i32::MAX) })?;
        self.comm.check_rank("active message destination", dest)
    }

    /// Starts a message of `len` bytes to `handler` on `dest`: `None` when there
    /// is no credit toward `dest` now (or FM's rule does not allow it yet).
    pub fn begin_message(&self, dest: u32, len: usize, handler: u32) -> Result<Option<Stream<'_, 'c>>> {
        let w = self.check(dest, handler)?;
        let out = self.comm.sh.engine.borrow_mut().can_send_now(w);
        Ok((out == fmx_transport::SendOutcome::Sent).then(|| Stream { am: self, dest, handler, len, buf: Vec::with_capacity(len) }))
    }

    /// Like [`ActiveMessages::begin_message`], extracting (and running handlers) until there is credit.
    pub fn begin_message_blocking(&self, dest: u32, len: usize, handler: u32) -> Result<Stream<'_, 'c>> {
        let w = self.check(dest, handler)?;
        self.comm.retry_until(&crate::engine::WaitsOn::Peer(w), "waiting for credit to begin an active message", || {
            if let Some(s) = self.begin_message(dest, len, handler)? {
                return Ok(Some(s));
            }
            self.extract(usize::MAX)?;
            Ok(None)
        })
    }

    fn send_now(&self, dest: u32, handler: u32, data: Vec<u8>) -> Result<()> {
        let w = self.comm.check_rank("active message destination", dest)?;
        // Never blocks: the engine owns the data until it is sent (a large message
        // stays exposed until the receiver's extract has read it).
        self.comm.sh.engine.borrow_mut().send_owned(self.comm.am_ctx(), handler, w, data)
    }

    /// Runs handlers of arrived messages until `max_bytes` are processed (FM's
    /// extract); returns the bytes processed.
    pub fn extract(&self, max_bytes: usize) -> Result<usize> {
        let sh = &self.comm.sh;
        sh.check_live("extract")?;
        let ctx = self.comm.am_ctx();
        sh.engine.borrow_mut().progress(&mut sh.lend.borrow_mut())?;
        let mut done = 0usize;
        while done < max_bytes {
            let next = sh.engine.borrow_mut().take_unexpected_eager(ctx);
            let (src, handler, data) = match next {
                Some(m) => m,
                None => {
                    let Some((src, handler, len)) = sh.engine.borrow().peek_unexpected_rts(ctx) else { break };
                    let mut data = vec![0u8; len as usize];
                    let rank = self.comm.world_to_comm[src as usize];
                    self.comm.recv_on(ctx, &mut data, Source::Rank(rank), Tag::Value(handler as i32))?;
                    (src, handler, data)
                }
            };
            let sender = self.comm.world_to_comm[src as usize];
            let mut replies = Replies::default();
            {
                let mut handlers = self.handlers.borrow_mut();
                let h = handlers.get_mut(&handler).ok_or(Error::InvalidCount {
                    what: "active message",
                    detail: format!("rank {sender} named handler {handler}, which is not registered here"),
                })?;
                let mut msg = Incoming { sender, handler, data: &data, pos: 0 };
                sh.in_handler.set(true);
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(&mut msg, &mut replies)));
                sh.in_handler.set(false);
                if let Err(p) = r {
                    std::panic::resume_unwind(p);
                }
            }
            for (dest, h, d) in replies.queued {
                self.send_now(dest, h, d)?;
            }
            done += data.len().max(1);
        }
        Ok(done)
    }
}
