//! Fuzz loops of the PMI-1 and PMI-2 parsers and `PMI_process_mapping`:
//! 10^6 mutated inputs each (FMX_FUZZ_ITERS for more). Nothing panics or
//! hangs, and what parses keeps its invariants.

use fmx_transport::mutate::{iterations, Mutator};

use super::{mapping, wire};

fn run(name: &str, seed: u64, corpus: &[&[u8]], mut check: impl FnMut(&[u8]) -> bool) {
    let mut m = Mutator::new(seed);
    let mut input = Vec::new();
    let (n, t) = (iterations(1_000_000), std::time::Instant::now());
    let mut accepted = 0u64;
    for _ in 0..n {
        m.mutate(corpus, &mut input);
        accepted += u64::from(check(&input));
    }
    eprintln!("fuzz {name}: {n} inputs ({accepted} accepted) in {:?}", t.elapsed());
    assert!(accepted < n, "{name}: the mutations must reach the error paths");
}

#[test]
fn fuzz_pmi1_replies() {
    let corpus: &[&[u8]] = &[
        b"cmd=get_result rc=0 msg=success value=(vector,(0,1,4))\n",
        b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
        b"cmd=barrier_out\n",
        b"cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n",
    ];
    run("PMI-1", 1, corpus, |b| {
        let mut r = b;
        match wire::read_v1(&mut r) {
            Ok(msg) => {
                assert!(!msg.cmd.contains('\n'));
                true
            }
            Err(_) => false,
        }
    });
}

#[test]
fn fuzz_pmi2_frames() {
    let corpus: &[&[u8]] = &[
        b"    55cmd=fullinit-response;rc=0;rank=3;size=4;appnum=0;spawner-jobid=;",
        b"    41cmd=kvs-get-response;rc=0;found=TRUE;value=a;;b;",
        b"    27cmd=kvs-fence-response;rc=0;",
    ];
    run("PMI-2", 2, corpus, |b| {
        let mut r = b;
        match wire::read_v2(&mut r) {
            Ok(msg) => {
                // What parsed re-encodes to a frame that parses to the same message
                // (keys are never escaped: fmx sends only plain ones).
                if msg.attrs.iter().all(|(k, _)| !k.contains([';', '='])) && !msg.cmd.contains(';') {
                    let again = wire::read_v2(&mut &msg.to_v2()[..]).expect("re-encoded frame");
                    assert_eq!(again, msg);
                }
                true
            }
            Err(_) => false,
        }
    });
}

#[test]
fn fuzz_process_mappings_and_hex_values() {
    let corpus: &[&[u8]] = &[b"(vector,(0,2,4),(2,1,3))", b"(vector,(0,1,3),(1,1,2))", b"(vector,(0,2,1))", b"0a1b2c3d"];
    run("PMI_process_mapping", 3, corpus, |b| {
        let text = String::from_utf8_lossy(b);
        let size = 1 + (b.len() as u32 % 64);
        let mapped = mapping::parse(&text, size).map(|nodes| assert_eq!(nodes.len(), size as usize)).is_ok();
        let hexed = wire::unhex(&text).is_some_and(|v| wire::hex(&v) == text.to_lowercase());
        mapped || hexed
    });
}
