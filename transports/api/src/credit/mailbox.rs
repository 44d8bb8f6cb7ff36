//! The credit mailbox word a peer writes into our memory with an 8-byte RDMA
//! WRITE (verbs) or `fi_inject_write` (libfabric): cumulative credit totals and the finalized flag. The upper half is
//! the complement of the lower, so a torn or not-yet-written word is ignored
//! (RDMA does not promise 8-byte atomicity; a later read sees the whole word).

/// Word `index` of a mailbox region that a device or provider writes on
/// peers' behalf, read atomically (never through a reference to plain memory).
pub fn load(region: &memmap2::MmapMut, index: usize) -> u64 {
    assert!((index + 1) * 8 <= region.len(), "mailbox word {index} outside a region of {} bytes", region.len());
    #[allow(clippy::cast_ptr_alignment)] // a page-aligned map
    // SAFETY: the map is page-aligned and holds word `index` (checked above);
    // it lives as long as the borrow, and AtomicU64 has the layout of u64.
    let word = unsafe { &*region.as_ptr().cast::<std::sync::atomic::AtomicU64>().add(index) };
    word.load(std::sync::atomic::Ordering::Acquire)
}

/// Encodes totals (data mod 2^16, control mod 2^8) and whether the writer finalized.
pub fn encode(data: u16, ctrl: u8, finalized: bool) -> u64 {
    let low = u32::from(data) | (u32::from(ctrl) << 16) | (u32::from(finalized) << 24);
    u64::from(low) | (u64::from(!low) << 32)
}

/// Decodes a word; `None` when it is empty or torn.
pub fn decode(word: u64) -> Option<(u16, u8, bool)> {
    let low = word as u32;
    ((word >> 32) as u32 == !low).then_some((low as u16, (low >> 16) as u8, low & (1 << 24) != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_torn_words() {
        for (d, k, f) in [(0, 0, false), (65535, 255, true), (1234, 7, false)] {
            assert_eq!(decode(encode(d, k, f)), Some((d, k, f)));
        }
        assert_eq!(decode(0), None, "never written");
        let w = encode(5, 1, false);
        let torn = (w & 0xffff_ffff) | (encode(6, 1, false) & !0xffff_ffff);
        assert_eq!(decode(torn), None);
    }
}
