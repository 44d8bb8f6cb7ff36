//! Matching a message among many posted receives: each iteration sends 8 B
//! to ourselves and receives it by exact (source, tag) while `n - 1` other
//! receives (other tags) stay posted; they are satisfied after the loop. With one queue scanned in order this
//! grew with `n`; with the index by (context, source, tag) it should not.
//! `cargo bench -p fmx --bench matching`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn matching(c: &mut Criterion) {
    let fmx = fmx::init().expect("a world of one");
    let w = fmx.world();
    let mut g = c.benchmark_group("exact match among n posted receives");
    for n in [1usize, 10, 100, 1_000, 10_000] {
        let mut parked = vec![[0u8; 8]; n - 1];
        w.scope(|s| {
            let mut waiting = Vec::new();
            for (i, b) in parked.iter_mut().enumerate() {
                // Tags above the one the loop uses: none of these matches in the loop.
                waiting.push(s.irecv(b, 0, 1 + i as i32)?);
            }
            g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
                let (x, mut y) = ([7u8; 8], [0u8; 8]);
                bench.iter(|| {
                    w.send(&x, 0, 0).expect("send to ourselves");
                    w.recv(&mut y, 0, 0).expect("receive from ourselves");
                });
            });
            // The scope ends only when every receive is complete: satisfy them.
            for (i, r) in waiting.into_iter().enumerate() {
                w.send(&[1u8; 8], 0, 1 + i as i32)?;
                s.wait(r)?;
            }
            Ok(())
        })
        .expect("the parked receives complete");
    }
    g.finish();
    drop(fmx);
}

criterion_group!(benches, matching);
criterion_main!(benches);
