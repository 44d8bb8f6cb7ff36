//! Segment files under /dev/shm: creation, mapping, naming, cleanup.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64};

use fmx_transport::TransportError;
use memmap2::MmapMut;

use crate::layout::{ctl, state, Layout, MAGIC, VERSION};

/// Where segment files live unless `FMX_SHM_DIR` says otherwise.
pub const DEFAULT_DIR: &str = "/dev/shm";

/// The directory for segment files.
pub fn shm_dir() -> PathBuf {
    fmx_transport::settings::var("FMX_SHM_DIR").map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from)
}

/// The file name prefix of every segment of `job`.
pub fn job_prefix(job: &str) -> String {
    format!("fmx-{job}-")
}

/// The path of `rank`'s segment in `job`.
pub fn segment_path(dir: &Path, job: &str, rank: u32) -> PathBuf {
    dir.join(format!("{}{rank}", job_prefix(job)))
}

/// Checks that a job id is safe inside a file name.
pub fn validate_job_id(job: &str) -> Result<(), TransportError> {
    if !job.is_empty() && job.len() <= 64 && job.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.') {
        Ok(())
    } else {
        Err(TransportError::Setup {
            what: format!("job id {job:?} (1..64 characters of [A-Za-z0-9_.])"),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })
    }
}

/// Removes every segment file of `job` in `dir`; returns how many it removed.
/// The launcher calls this when a job ends, however it ended.
pub fn cleanup_job(dir: &Path, job: &str) -> usize {
    fmx_transport::sweep::remove_files_with_prefix(dir, &job_prefix(job))
}

/// A mapped segment, this process's own or a peer's.
pub struct Segment {
    map: MmapMut,
    layout: Layout,
    path: PathBuf,
}

fn setup_err(what: String) -> impl FnOnce(std::io::Error) -> TransportError {
    move |source| TransportError::Setup { what, source }
}

/// Sizes the segment and reserves its space: a tmpfs file whose size is only
/// set would let the first store into an unbacked page kill the process with
/// SIGBUS when `/dev/shm` is full. A full filesystem is an error at init
/// instead, naming the directory, the bytes needed and the bytes free.
fn reserve(file: &std::fs::File, path: &Path, bytes: u64) -> Result<(), TransportError> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, bytes) {
        Ok(()) => Ok(()),
        // A filesystem without fallocate (rare for tmpfs): the size alone.
        Err(rustix::io::Errno::OPNOTSUPP) => {
            file.set_len(bytes).map_err(setup_err(format!("sizing shm segment {} to {bytes} bytes", path.display())))
        }
        Err(e) => {
            let dir = path.parent().unwrap_or(Path::new("/"));
            let free = rustix::fs::statvfs(dir).map_or_else(|_| "unknown".to_string(), |s| (s.f_bavail * s.f_frsize).to_string());
            Err(TransportError::Setup {
                what: format!(
                    "reserving {bytes} bytes for shm segment {} in {} ({free} bytes free there; raise the size of {}, or lower FMX_POOL_SLOTS or FMX_SLOT_BYTES)",
                    path.display(),
                    dir.display(),
                    dir.display()
                ),
                source: e.into(),
            })
        }
    }
}

impl Segment {
    /// Creates and maps this process's segment (fails if the file exists).
    pub fn create(path: PathBuf, rank: u32, layout: Layout) -> Result<Self, TransportError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(setup_err(format!("creating shm segment {}", path.display())))?;
        if let Err(e) = reserve(&file, &path, layout.segment_bytes() as u64) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        // SAFETY: the file was just created by us with O_EXCL and mode 0600; other
        // processes of the job map it too, which is the point: every shared word is
        // accessed atomically or under the slot protocol (see `ring`), never through
        // Rust references to the same bytes from two sides.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(setup_err(format!("mapping shm segment {}", path.display())))?;
        let seg = Self { map, layout, path };
        seg.put_u64(ctl::MAGIC, MAGIC);
        seg.put_u32(ctl::VERSION, VERSION);
        seg.put_u32(ctl::RANK, rank);
        seg.put_u32(ctl::SIZE, layout.size);
        seg.put_u32(ctl::POOL, layout.pool);
        seg.put_u64(ctl::SLOT_BYTES, layout.slot_bytes as u64);
        seg.put_u32(ctl::PID, std::process::id());
        seg.u32_at(ctl::STATE).store(state::RUNNING, std::sync::atomic::Ordering::Release);
        Ok(seg)
    }

    /// Maps a peer's segment and checks it belongs to `rank` of a job laid out like ours.
    pub fn open(path: PathBuf, rank: u32, layout: Layout) -> Result<Self, TransportError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(setup_err(format!("opening rank {rank}'s shm segment {}", path.display())))?;
        let len = file.metadata().map_err(setup_err(format!("stat of {}", path.display())))?.len();
        if len != layout.segment_bytes() as u64 {
            return Err(TransportError::Setup {
                what: format!("rank {rank}'s shm segment {} has {len} bytes, expected {}", path.display(), layout.segment_bytes()),
                source: std::io::Error::from(std::io::ErrorKind::InvalidData),
            });
        }
        // SAFETY: as in `create`: a segment of this job, shared on purpose and accessed
        // only atomically or under the slot protocol.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(setup_err(format!("mapping {}", path.display())))?;
        let seg = Self { map, layout, path };
        let ok = seg.get_u64(ctl::MAGIC) == MAGIC
            && seg.get_u32(ctl::VERSION) == VERSION
            && seg.get_u32(ctl::RANK) == rank
            && seg.get_u32(ctl::SIZE) == layout.size
            && seg.get_u32(ctl::POOL) == layout.pool
            && seg.get_u64(ctl::SLOT_BYTES) == layout.slot_bytes as u64;
        if !ok {
            return Err(TransportError::Setup {
                what: format!("{} is not rank {rank}'s segment of this job (magic, version or geometry differ)", seg.path.display()),
                source: std::io::Error::from(std::io::ErrorKind::InvalidData),
            });
        }
        Ok(seg)
    }

    /// The segment's file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The geometry.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The owner's pid.
    pub fn owner_pid(&self) -> u32 {
        self.get_u32(ctl::PID)
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty (never, for a valid segment).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Base address of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.map.as_ptr().cast_mut()
    }

    /// Gives the whole pages inside `off..off + len` back to the system (the
    /// file's pages are freed; they read as zeros if touched again). For slots
    /// no sender will write and no reader will read any more.
    pub fn release_range(&self, off: usize, len: usize) {
        const PAGE: usize = 4096;
        let start = off.next_multiple_of(PAGE);
        let end = (off + len).min(self.map.len()) / PAGE * PAGE;
        if start >= end {
            return;
        }
        // SAFETY: MADV_REMOVE only frees (zeroes) the pages of this shared file
        // mapping; the caller guarantees no process uses these bytes any more:
        // they are slots beyond a sender's switched window (the sender never
        // writes them again, the reader never reads them), and no Rust
        // reference to them exists (slots are read through raw pointers only).
        // A failure (e.g. a filesystem without hole punching) changes nothing.
        let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::Remove, start, end - start) };
    }

    #[inline]
    fn check(&self, off: usize, bytes: usize) {
        debug_assert!(bytes.is_power_of_two());
        // A mask, not `%`: this runs on every look at a slot.
        assert!(off & (bytes - 1) == 0 && off + bytes <= self.map.len(), "segment offset {off} misaligned or out of bounds");
    }

    /// The shared 64-bit word at `off`.
    #[allow(clippy::cast_ptr_alignment)] // alignment of `off` is checked; the mapping is page aligned
    #[inline]
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        // SAFETY: `off` is in bounds and 8-aligned (checked; the mapping is page
        // aligned); AtomicU64 has the layout of u64; the reference lives no longer
        // than the mapping (`&self`); every process touches this word atomically only.
        unsafe { &*self.base().add(off).cast::<AtomicU64>() }
    }

    /// The shared 32-bit word at `off`.
    #[allow(clippy::cast_ptr_alignment)] // as in `u64_at`
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        // SAFETY: as in `u64_at`, for a 4-aligned 32-bit word.
        unsafe { &*self.base().add(off).cast::<AtomicU32>() }
    }

    fn put_u64(&self, off: usize, v: u64) {
        self.u64_at(off).store(v, std::sync::atomic::Ordering::Relaxed);
    }
    fn put_u32(&self, off: usize, v: u32) {
        self.u32_at(off).store(v, std::sync::atomic::Ordering::Relaxed);
    }
    fn get_u64(&self, off: usize) -> u64 {
        self.u64_at(off).load(std::sync::atomic::Ordering::Acquire)
    }
    fn get_u32(&self, off: usize) -> u32 {
        self.u32_at(off).load(std::sync::atomic::Ordering::Acquire)
    }

    /// The owner's state word.
    pub fn state(&self) -> &AtomicU32 {
        self.u32_at(ctl::STATE)
    }
}
