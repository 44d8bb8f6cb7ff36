//! Eager headers in immediate data, so that a payload of a whole MTU
//! (4 KiB on rxe and most RoCE ports) crosses in one packet, as perftest's
//! does, instead of two because 32 bytes of header precede it.
//!
//! A compacted eager message carries no header in the slot: its 32-bit
//! immediate value names an entry of a small per-connection dictionary of
//! match bits and carries the credits it returns; the length is the
//! completion's byte count, the cookie is 0. The sender teaches an entry by
//! sending one whole-header message with a "learn" immediate; the receiver
//! files that message's match bits under the index. An RC queue pair
//! delivers in order, so the two dictionaries agree without any other
//! message. Only messages that the header would push past a packet
//! boundary are compacted ([`saves_a_packet`]): the 8 B path is unchanged.

/// Dictionary entries per connection (the index takes 3 bits).
const ENTRIES: usize = 8;
/// Set in a compacted message's immediate value; clear in a "learn" one.
const COMPACT: u32 = 1 << 31;

/// What an eager message's immediate value says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Imm {
    /// The slot holds a whole header; file its match bits under `index`.
    Learn { index: u8 },
    /// The slot holds the payload only; the header is rebuilt from these.
    Compact { index: u8, credits: u16, ctrl_credits: u8 },
}

impl Imm {
    /// The 32-bit value: bit 31 compact, bits 28..31 the index, then 16
    /// bits of data credits and 8 of control credits.
    pub(crate) fn encode(self) -> u32 {
        match self {
            Self::Learn { index } => u32::from(index) << 28,
            Self::Compact { index, credits, ctrl_credits } => {
                COMPACT | u32::from(index) << 28 | u32::from(credits) << 8 | u32::from(ctrl_credits)
            }
        }
    }

    /// Reads a value [`Imm::encode`] wrote; `None` for one it never writes.
    pub(crate) fn decode(v: u32) -> Option<Self> {
        let index = ((v >> 28) & 0x7) as u8;
        if v & COMPACT == 0 {
            return (v.trailing_zeros() >= 28).then_some(Self::Learn { index });
        }
        Some(Self::Compact { index, credits: (v >> 8) as u16, ctrl_credits: v as u8 })
    }
}

/// Whether the header pushes a payload of `len` bytes into one more packet at `mtu`.
pub(crate) fn saves_a_packet(len: usize, mtu: usize) -> bool {
    len > 0 && mtu > 0 && (len + fmx_transport::HEADER_BYTES).div_ceil(mtu) > len.div_ceil(mtu)
}

/// The sender's side: which match bits the peer has filed, and where.
#[derive(Debug, Default)]
pub(crate) struct SendDict {
    entries: [Option<u64>; ENTRIES],
    /// The entry the next new match bits replace (round robin).
    next: u8,
}

impl SendDict {
    /// The index the peer has `bits` under, or the one a learn message would
    /// file them under; [`SendDict::taught`] once that message is posted.
    pub(crate) fn lookup(&self, bits: u64) -> Result<u8, u8> {
        match self.entries.iter().position(|e| *e == Some(bits)) {
            Some(i) => Ok(i as u8),
            None => Err(self.next),
        }
    }

    /// A learn message for `bits` under `index` went out.
    pub(crate) fn taught(&mut self, index: u8, bits: u64) {
        self.entries[usize::from(index)] = Some(bits);
        self.next = (index + 1) % ENTRIES as u8;
    }
}

/// The receiver's side: the match bits the sender taught.
#[derive(Debug, Default)]
pub(crate) struct RecvDict {
    entries: [Option<u64>; ENTRIES],
}

impl RecvDict {
    pub(crate) fn learn(&mut self, index: u8, bits: u64) {
        self.entries[usize::from(index) % ENTRIES] = Some(bits);
    }

    /// The match bits filed under `index`; `None` if the sender never taught it.
    pub(crate) fn get(&self, index: u8) -> Option<u64> {
        self.entries.get(usize::from(index)).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_values_round_trip() {
        for imm in [
            Imm::Learn { index: 0 },
            Imm::Learn { index: 7 },
            Imm::Compact { index: 0, credits: 0, ctrl_credits: 0 },
            Imm::Compact { index: 5, credits: u16::MAX, ctrl_credits: u8::MAX },
            Imm::Compact { index: 7, credits: 513, ctrl_credits: 2 },
        ] {
            assert_eq!(Imm::decode(imm.encode()), Some(imm), "{imm:?}");
        }
        // A learn value with stray bits is not one fmx writes.
        assert_eq!(Imm::decode(0x0000_0100), None);
    }

    #[test]
    fn only_payloads_the_header_pushes_over_a_boundary_are_compacted() {
        assert!(!saves_a_packet(8, 4096));
        assert!(!saves_a_packet(4064, 4096)); // 4064 + 32 fits exactly
        assert!(saves_a_packet(4065, 4096));
        assert!(saves_a_packet(4096, 4096));
        assert!(!saves_a_packet(4097, 4096)); // two packets either way
        assert!(saves_a_packet(8192, 4096));
        assert!(saves_a_packet(1024, 1024));
        assert!(!saves_a_packet(0, 4096));
        assert!(!saves_a_packet(4096, 0));
    }

    /// The two sides stay in step through replacements: whatever the sender
    /// compacts, the receiver resolves to the same match bits.
    #[test]
    fn sender_and_receiver_dictionaries_agree_through_replacement() {
        let (mut tx, mut rx) = (SendDict::default(), RecvDict::default());
        let mut compacted = 0;
        // Working sets of 3, 8, 12 (more than the entries: every lookup
        // misses and replaces) and 2 match bits, 100 messages each.
        for step in 0..400u64 {
            let set = [3, 8, 12, 2][(step / 100) as usize];
            let bits = step % set + 0x1_0000_0000 * (step / 100);
            let imm = match tx.lookup(bits) {
                Ok(index) => Imm::Compact { index, credits: step as u16, ctrl_credits: 1 },
                Err(index) => {
                    tx.taught(index, bits);
                    Imm::Learn { index }
                }
            };
            // The wire: only the immediate value (and, to learn, the header).
            match Imm::decode(imm.encode()).expect("fmx's own value") {
                Imm::Learn { index } => rx.learn(index, bits),
                Imm::Compact { index, .. } => {
                    assert_eq!(rx.get(index), Some(bits), "step {step}");
                    compacted += 1;
                }
            }
        }
        assert!(compacted > 100, "repeats compacted: {compacted}");
        let mut steady = SendDict::default();
        let i = steady.lookup(42).unwrap_err();
        steady.taught(i, 42);
        assert_eq!(steady.lookup(42), Ok(i));
        assert_eq!(RecvDict::default().get(3), None);
    }
}
