//! Helpers shared by the rank programs and the tests that launch them.

pub mod launchers;
pub mod topology;

/// A job's captured output, one `[rank] line` (or `[rank err] line`) per line, for assertion messages.
pub fn dump(o: &fmx::launcher::Outcome) -> String {
    o.lines.iter().map(|(r, e, l)| format!("[{r}{}] {l}\n", if *e { " err" } else { "" })).collect()
}

/// The byte at index `i` of message `m` from `src` (content checks).
pub fn pattern(src: u32, m: u64, i: usize) -> u8 {
    ((i as u64).wrapping_mul(31) ^ m.wrapping_mul(131) ^ u64::from(src).wrapping_mul(7)) as u8
}

/// Fills `buf` with [`pattern`].
pub fn fill(buf: &mut [u8], src: u32, m: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(src, m, i);
    }
}

/// The first index where `buf` differs from [`pattern`].
pub fn first_mismatch(buf: &[u8], src: u32, m: u64) -> Option<usize> {
    buf.iter().enumerate().position(|(i, &b)| b != pattern(src, m, i))
}
