//! fmx started through a program's own bootstrap (`fmx::init_with_bootstrap`),
//! with no launcher: the test starts the processes itself and gives each
//! `USERBOOT_DIR`, `USERBOOT_RANK` and `USERBOOT_SIZE`; the bootstrap's
//! allgather goes through files in that directory, as a job's shared file
//! system could carry it. `USERBOOT_FAIL=1` makes the allgather fail (the
//! error must name it).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fmx::{Op, UserBootstrap};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct FileBootstrap {
    dir: PathBuf,
    rank: u32,
    size: u32,
    round: u32,
    fail: bool,
}

impl UserBootstrap for FileBootstrap {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn size(&self) -> u32 {
        self.size
    }
    /// All on this host; with `USERBOOT_ODD_NODES=R`, rank R alone claims the
    /// last rank runs on another node (a map that disagrees between ranks).
    fn nodes(&self) -> Vec<u32> {
        let mut nodes = vec![0; self.size as usize];
        if std::env::var("USERBOOT_ODD_NODES").is_ok_and(|r| r == self.rank.to_string()) {
            nodes[self.size as usize - 1] = 1;
        }
        nodes
    }
    fn job_id(&self) -> String {
        let name = self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        name.chars().filter(char::is_ascii_alphanumeric).collect()
    }
    fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, BoxError> {
        if self.fail {
            return Err("the shared directory is read-only (USERBOOT_FAIL)".into());
        }
        let round = self.round;
        self.round += 1;
        let file = |r: u32| self.dir.join(format!("{round}-{r}"));
        // Written whole, then renamed: a reader never sees half a blob.
        let tmp = self.dir.join(format!("{round}-{}.tmp", self.rank));
        std::fs::write(&tmp, blob)?;
        std::fs::rename(&tmp, file(self.rank))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        (0..self.size)
            .map(|r| loop {
                match std::fs::read(file(r)) {
                    Ok(b) => break Ok(b),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => break Err(format!("rank {r}'s blob of round {round}: {e}").into()),
                }
            })
            .collect()
    }
    fn barrier(&mut self) -> Result<(), BoxError> {
        self.allgather(&[]).map(drop)
    }
}

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

fn run() -> Result<(), String> {
    let num = |name: &str| var(name)?.parse::<u32>().map_err(|e| format!("{name}: {e}"));
    let boot = FileBootstrap {
        dir: PathBuf::from(var("USERBOOT_DIR")?),
        rank: num("USERBOOT_RANK")?,
        size: num("USERBOOT_SIZE")?,
        round: 0,
        fail: std::env::var_os("USERBOOT_FAIL").is_some(),
    };
    let fmx = fmx::init_with_bootstrap(Box::new(boot), fmx::InitOptions::default()).map_err(|e| format!("init: {e}"))?;
    let w = fmx.world();
    let (me, n) = (w.rank(), w.size());
    if fmx.launcher() != "program" {
        return Err(format!("launcher() says {:?}", fmx.launcher()));
    }
    // A ring of small and large (rendezvous) messages, then collectives.
    for len in [8usize, 1 << 20] {
        let out = vec![me as u8; len];
        let mut got = vec![0u8; len];
        w.sendrecv(&out, (me + 1) % n, 1, &mut got, (me + n - 1) % n, 1).map_err(|e| e.to_string())?;
        let left = ((me + n - 1) % n) as u8;
        if got.iter().any(|&b| b != left) {
            return Err(format!("the {len}-byte message from rank {left} differs"));
        }
    }
    let mut sum = [0u64];
    w.allreduce(&[u64::from(me) + 1], &mut sum, Op::Sum).map_err(|e| e.to_string())?;
    let want = u64::from(n) * u64::from(n + 1) / 2;
    if sum[0] != want {
        return Err(format!("allreduce gave {} (want {want})", sum[0]));
    }
    let mut b = [if me == 0 { 42u32 } else { 0 }];
    w.bcast(&mut b, 0).map_err(|e| e.to_string())?;
    if b[0] != 42 {
        return Err(format!("bcast gave {}", b[0]));
    }
    if fmx.spawn_world(1, "").is_ok() {
        return Err("spawn_world succeeded without a launcher".into());
    }
    fmx.finalize().map_err(|e| format!("finalize: {e}"))
}

fn main() {
    fmx_itest::report("userboot", run());
}
