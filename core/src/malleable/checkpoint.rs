//! Checkpoint-restart mode: the old world's state in files, written
//! atomically (temporary file, fsync, rename, fsync of the directory), read
//! back by the new world, removed once every new rank has read it.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::blocks::{block_range, receives_of};
use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"FMXCKPT1";
/// Magic, element size, global n, rank, size.
const HEADER: usize = 8 + 8 + 8 + 4 + 4;

/// Where one generation's files go.
#[derive(Clone, Debug)]
pub(crate) struct Generation {
    pub(crate) dir: PathBuf,
    /// The reconfiguration these files carry across (1 for the first).
    pub(crate) number: u32,
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Reconfig(format!("{what}: {e}"))
}

pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(Error::Reconfig(format!("state name {name:?}: use letters, digits, '_' and '-' (it names a checkpoint file)")));
    }
    Ok(())
}

impl Generation {
    fn block_path(&self, name: &str, rank: u32, size: u32) -> PathBuf {
        self.dir.join(format!("{name}.g{}.r{rank}of{size}", self.number))
    }

    fn value_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.g{}.value", self.number))
    }

    /// Writes `bytes` under `path` so that a reader sees all of it or nothing.
    fn write_atomically(&self, path: &Path, header: &[u8], bytes: &[u8]) -> Result<()> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let shown = path.display().to_string();
        let mut f = File::create(&tmp).map_err(io_err(format!("creating {}", tmp.display())))?;
        f.write_all(header).and_then(|()| f.write_all(bytes)).map_err(io_err(format!("writing {}", tmp.display())))?;
        f.sync_all().map_err(io_err(format!("fsync of {}", tmp.display())))?;
        std::fs::rename(&tmp, path).map_err(io_err(format!("renaming {} to {shown}", tmp.display())))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io_err(format!("fsync of directory {}", self.dir.display())))
    }

    /// Old rank `rank` of `size`: its block of `global_n` elements.
    pub(crate) fn write_block(&self, name: &str, rank: u32, size: u32, global_n: u64, elem: usize, bytes: &[u8]) -> Result<()> {
        check_name(name)?;
        std::fs::create_dir_all(&self.dir).map_err(io_err(format!("creating checkpoint directory {}", self.dir.display())))?;
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&(elem as u64).to_le_bytes());
        h.extend_from_slice(&global_n.to_le_bytes());
        h.extend_from_slice(&rank.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        self.write_atomically(&self.block_path(name, rank, size), &h, bytes)
    }

    /// Old rank 0: a value.
    pub(crate) fn write_value(&self, name: &str, bytes: &[u8]) -> Result<()> {
        check_name(name)?;
        std::fs::create_dir_all(&self.dir).map_err(io_err(format!("creating checkpoint directory {}", self.dir.display())))?;
        self.write_atomically(&self.value_path(name), MAGIC, bytes)
    }

    /// New rank `rank` of `size`: its block, read from the old ranks' files
    /// (`old` of them) that overlap it, straight into `out`.
    pub(crate) fn read_block<T: bytemuck::Pod>(
        &self,
        name: &str,
        rank: u32,
        size: u32,
        old: u32,
        global_n: u64,
        out: &mut [T],
    ) -> Result<()> {
        check_name(name)?;
        let elem = std::mem::size_of::<T>();
        let out: &mut [u8] = bytemuck::cast_slice_mut(out);
        let mine = block_range(rank, size, global_n);
        for t in receives_of(rank, old, size, global_n) {
            let path = self.block_path(name, t.from, old);
            let f = File::open(&path).map_err(io_err(format!("opening checkpoint {}", path.display())))?;
            let mut h = [0u8; HEADER];
            f.read_exact_at(&mut h, 0).map_err(io_err(format!("reading the header of {}", path.display())))?;
            let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
            let found = (&h[..8], word(8), word(16));
            if found != (&MAGIC[..], elem as u64, global_n) {
                return Err(Error::Reconfig(format!(
                    "checkpoint {} holds {}-byte elements of an array of {} (expected {elem}-byte elements of {global_n})",
                    path.display(),
                    found.1,
                    found.2
                )));
            }
            let from = block_range(t.from, old, global_n);
            let at = HEADER as u64 + (t.range.start - from.start) * elem as u64;
            let dst = &mut out[((t.range.start - mine.start) as usize * elem)..((t.range.end - mine.start) as usize * elem)];
            f.read_exact_at(dst, at).map_err(io_err(format!(
                "reading {} bytes at {at} of {} (is it truncated?)",
                dst.len(),
                path.display()
            )))?;
        }
        Ok(())
    }

    /// A value old rank 0 wrote, into `out` (its length must match).
    pub(crate) fn read_value(&self, name: &str, out: &mut [u8]) -> Result<()> {
        check_name(name)?;
        let path = self.value_path(name);
        let bytes = std::fs::read(&path).map_err(io_err(format!("reading checkpoint {}", path.display())))?;
        if bytes.len() != MAGIC.len() + out.len() || &bytes[..8] != MAGIC {
            return Err(Error::Reconfig(format!(
                "checkpoint {} holds {} bytes of value; {} were expected",
                path.display(),
                bytes.len().saturating_sub(8),
                out.len()
            )));
        }
        out.copy_from_slice(&bytes[8..]);
        Ok(())
    }

    /// Removes this generation's files (after every new rank has read them).
    pub(crate) fn remove(&self, blocks: &[String], values: &[String], old: u32) {
        for name in blocks {
            for r in 0..old {
                let _ = std::fs::remove_file(self.block_path(name, r, old));
            }
        }
        for name in values {
            let _ = std::fs::remove_file(self.value_path(name));
        }
    }
}
