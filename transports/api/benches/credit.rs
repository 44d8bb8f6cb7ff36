//! The credit fast path: what every eager send and receive pays for flow control.
//! `cargo bench -p fmx-transport --bench credit`

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fmx_transport::credit::{Class, CreditConfig, Gate, PeerCredits};

fn fast_path(c: &mut Criterion) {
    let cfg = CreditConfig::for_pool(64, 1, 2, None).expect("config");
    c.bench_function("send: try_take + piggyback", |b| {
        let mut tx = PeerCredits::new(&cfg, true);
        let mut rx = PeerCredits::new(&cfg, false);
        rx.on_receive(0, 0);
        b.iter(|| {
            if tx.try_take(Class::Data) != Gate::Go {
                let (d, k) = rx.explicit();
                tx.on_credit(d, k);
                assert_eq!(tx.try_take(Class::Data), Gate::Go);
            }
            black_box(tx.piggyback());
            rx.on_release(Class::Data);
        });
    });
    c.bench_function("receive: on_receive + on_release + wants_explicit", |b| {
        let mut rx = PeerCredits::new(&cfg, false);
        let mut total = 0u16;
        b.iter(|| {
            total = total.wrapping_add(1);
            rx.on_receive(black_box(total), 0);
            rx.on_release(Class::Data);
            if rx.wants_explicit(&cfg) {
                black_box(rx.explicit());
            }
        });
    });
}

criterion_group!(benches, fast_path);
criterion_main!(benches);
