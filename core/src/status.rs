//! Sources, tags and statuses of point-to-point operations.

/// Where a receive accepts messages from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// One rank of the communicator.
    Rank(u32),
    /// Any rank (`MPI_ANY_SOURCE`).
    Any,
}

impl From<u32> for Source {
    fn from(r: u32) -> Self {
        Self::Rank(r)
    }
}

/// Which tag a receive accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// One tag, `0..=TAG_UB`.
    Value(i32),
    /// Any tag (`MPI_ANY_TAG`).
    Any,
}

impl From<i32> for Tag {
    fn from(t: i32) -> Self {
        Self::Value(t)
    }
}

/// The largest tag (`MPI_TAG_UB`).
pub const TAG_UB: i32 = i32::MAX;

/// What a completed operation reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Rank of the sender in the communicator (for a send: our own rank).
    pub source: u32,
    /// Tag of the message.
    pub tag: i32,
    /// Elements received (or sent).
    pub count: usize,
    /// Bytes received (or sent).
    pub bytes: u64,
}
