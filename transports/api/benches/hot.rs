//! Hot pieces every message pays for outside the transport's ring:
//! encoding and decoding the 32-byte header, and lending a buffer to an
//! operation (a scope, one loan, its retirement), alone and with 10^4
//! other loans outstanding in an outer scope.
//! `cargo bench -p fmx-transport --bench hot`

use std::cell::RefCell;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fmx_transport::lend::{lend_scope, LendTable};
use fmx_transport::{MsgHeader, HEADER_BYTES};

fn header(c: &mut Criterion) {
    let h = MsgHeader::eager(0x1234_5678_9abc, 8, 0);
    c.bench_function("header: encode", |b| {
        let mut out = [0u8; HEADER_BYTES];
        b.iter(|| {
            black_box(&h).encode(&mut out);
            black_box(&out);
        });
    });
    let mut wire = [0u8; HEADER_BYTES];
    h.encode(&mut wire);
    c.bench_function("header: decode", |b| b.iter(|| MsgHeader::decode(black_box(&wire)).expect("a header")));
}

fn lend(c: &mut Criterion) {
    let table = RefCell::new(LendTable::new());
    let mut buf = [0u8; 8];
    c.bench_function("lend: scope + lend_mut + retire", |b| {
        b.iter(|| lend_scope(&table, |s| black_box(s.lend_mut(&mut buf))));
    });
    let parked = vec![[0u8; 8]; 10_000];
    lend_scope(&table, |outer| {
        for p in &parked {
            outer.lend(p);
        }
        c.bench_function("lend: scope + lend_mut + retire, 10^4 loans outstanding", |b| {
            b.iter(|| lend_scope(&table, |s| black_box(s.lend_mut(&mut buf))));
        });
    });
}

criterion_group!(benches, header, lend);
criterion_main!(benches);
