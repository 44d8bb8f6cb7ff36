//! Byte-string mutations for the fuzz loops of fmx's wire codecs (the
//! transport header, fmxrun's bootstrap frames, the PMI parsers): each
//! input is a valid message of a corpus, truncated, extended, bit-flipped,
//! spliced or with a length field overwritten by extreme values. Fast and
//! deterministic (a seeded splitmix64), so a CI test runs 10^6 inputs per
//! codec in seconds, and `FMX_FUZZ_ITERS` runs more.

/// Inputs a fuzz loop runs: `FMX_FUZZ_ITERS`, else `default`.
pub fn iterations(default: u64) -> u64 {
    std::env::var("FMX_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A seeded generator of mutated inputs.
pub struct Mutator {
    state: u64,
}

impl Mutator {
    /// A generator with `seed` (the same seed gives the same inputs).
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits (splitmix64).
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// A mutation of one of `corpus`'s messages, into `out` (reused).
    pub fn mutate(&mut self, corpus: &[&[u8]], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(corpus[self.below(corpus.len())]);
        for _ in 0..1 + self.below(3) {
            let len = out.len();
            match self.below(8) {
                0 => out.truncate(self.below(len + 1)),
                1 if len > 0 => {
                    let i = self.below(len);
                    out[i] ^= 1 << self.below(8);
                }
                2 if len > 0 => {
                    let i = self.below(len);
                    out[i] = self.next_u64() as u8;
                }
                3 => {
                    let i = self.below(len + 1);
                    let n = self.below(16);
                    let extra: Vec<u8> = (0..n).map(|_| self.next_u64() as u8).collect();
                    out.splice(i..i, extra);
                }
                4 if len >= 4 => {
                    // An extreme length or number where a field may be.
                    let i = self.below(len - 3);
                    let v: u32 = [0, 1, u32::MAX, u32::MAX - 1, 1 << 31, 64 << 20][self.below(6)];
                    out[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
                5 => {
                    let other = corpus[self.below(corpus.len())];
                    let at = self.below(len + 1);
                    out.truncate(at);
                    out.extend_from_slice(&other[self.below(other.len() + 1)..]);
                }
                6 if len > 0 => {
                    // Digits where text has numbers: 99999999999, -1, 4294967296.
                    let i = self.below(len);
                    let d: &[u8] = [&b"99999999999"[..], b"-1", b"4294967296", b"0"][self.below(4)];
                    out.splice(i..i, d.iter().copied());
                }
                _ => {
                    let n = self.below(64);
                    out.extend((0..n).map(|_| self.next_u64() as u8));
                }
            }
        }
    }
}
