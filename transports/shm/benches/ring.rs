//! The shared-memory ring's own cost per message, on one core: write a
//! header and payload into the next slot, see it published, decode it,
//! move past it and release it. The cache lines stay on this core, so this
//! is the software's part; the line's trip between cores is what
//! `fmx-perf limits` measures (one handoff) and `fmx-perf latency` pays.
//! `cargo bench -p fmx-shm --bench ring`

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fmx_shm::layout::Layout;
use fmx_shm::ring::{RxRing, TxRing};
use fmx_shm::segment::Segment;
use fmx_transport::MsgHeader;

fn ring(c: &mut Criterion) {
    let path = std::env::temp_dir().join(format!("fmx-bench-ring-{}", std::process::id()));
    let layout = Layout::new(2, 64, 8192);
    let seg = Segment::create(path.clone(), 0, layout).expect("a segment");
    // Rank 1 writes into rank 0's segment; rank 0 reads it: both ends here.
    let (mut tx, mut rx) = (TxRing::new(layout.data_ring(0, 1)), RxRing::new(layout.data_ring(0, 1)));
    for len in [8usize, 1024] {
        let payload = vec![7u8; len];
        let header = MsgHeader::eager(0x1234_5678, len, 0);
        c.bench_function(&format!("ring: write + peek + advance + release, {len} B"), |b| {
            b.iter(|| {
                tx.write(&seg, black_box(&header), black_box(&payload));
                let slot = rx.peek(&seg).expect("published");
                let off = slot.offset;
                black_box(slot.payload);
                rx.advance();
                black_box(rx.release(off));
            });
        });
    }
    drop(seg);
    let _ = std::fs::remove_file(path);
}

criterion_group!(benches, ring);
criterion_main!(benches);
