//! fmx inside an existing MPI job, as NCCL and UCC are bootstrapped: MPI
//! starts first, fmx starts on the same ranks through MPI's collectives
//! ([`fmx::UserBootstrap`]), both run, then fmx finalizes before MPI does.
//!
//! ```sh
//! MPICC=mpicc.mpich cargo build -p fmx-mpi-bootstrap
//! mpiexec.hydra -iface lo -n 4 target/debug/fmx-mpi-bootstrap
//! ```
//!
//! Each rank exchanges with its two ring neighbours through an fmx
//! distributed graph (`neighbor_alltoall`) and checks the answer against
//! MPI's own `MPI_Allreduce`.

use mpi::collective::CommunicatorCollectives;
use mpi::datatype::PartitionMut;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::Root;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// fmx's bootstrap over an MPI communicator.
struct MpiBootstrap {
    comm: SimpleCommunicator,
    nodes: Vec<u32>,
    job: String,
}

impl MpiBootstrap {
    /// Collective over `comm`: learns which ranks share a node
    /// (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`) and agrees on a job id.
    fn new(comm: SimpleCommunicator) -> Self {
        // Each node is named by the world rank of its first process; numbered
        // densely in order of first appearance.
        let shared = comm.split_shared(comm.rank());
        let mut leader = comm.rank();
        shared.process_at_rank(0).broadcast_into(&mut leader);
        let mut leaders = vec![0i32; comm.size() as usize];
        comm.all_gather_into(&leader, &mut leaders[..]);
        let mut seen: Vec<i32> = Vec::new();
        let nodes = leaders
            .iter()
            .map(|l| {
                let at = seen.iter().position(|s| s == l).unwrap_or_else(|| {
                    seen.push(*l);
                    seen.len() - 1
                });
                at as u32
            })
            .collect();
        // Unique among the jobs on each host: rank 0's pid and the time.
        let mut id = [0u64; 2];
        if comm.rank() == 0 {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
            id = [u64::from(std::process::id()), nanos];
        }
        comm.process_at_rank(0).broadcast_into(&mut id[..]);
        Self { comm, nodes, job: format!("mpi_{}_{}", id[0], id[1]) }
    }
}

impl fmx::UserBootstrap for MpiBootstrap {
    fn rank(&self) -> u32 {
        self.comm.rank() as u32
    }

    fn size(&self) -> u32 {
        self.comm.size() as u32
    }

    fn nodes(&self) -> Vec<u32> {
        self.nodes.clone()
    }

    fn job_id(&self) -> String {
        self.job.clone()
    }

    /// `MPI_Allgather` of the lengths, then `MPI_Allgatherv` of the bytes.
    fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, BoxError> {
        let len = i32::try_from(blob.len()).map_err(|_| format!("a blob of {} bytes is too long for MPI's counts", blob.len()))?;
        let mut lens = vec![0i32; self.comm.size() as usize];
        self.comm.all_gather_into(&len, &mut lens[..]);
        let displs: Vec<i32> = lens.iter().scan(0i32, |at, &l| Some(std::mem::replace(at, *at + l))).collect();
        let total: i32 = lens.iter().sum();
        let mut all = vec![0u8; total as usize];
        {
            let mut part = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
            self.comm.all_gather_varcount_into(blob, &mut part);
        }
        Ok(lens.iter().zip(&displs).map(|(&l, &d)| all[d as usize..(d + l) as usize].to_vec()).collect())
    }

    fn barrier(&mut self) -> Result<(), BoxError> {
        self.comm.barrier();
        Ok(())
    }
}

fn run(world: &SimpleCommunicator) -> Result<(), String> {
    let boot = MpiBootstrap::new(world.duplicate());
    let fmx = fmx::init_with_bootstrap(Box::new(boot), fmx::InitOptions::default()).map_err(|e| format!("fmx init: {e}"))?;
    let w = fmx.world();
    if (w.rank(), w.size()) != (world.rank() as u32, world.size() as u32) {
        return Err(format!("fmx says rank {} of {}, MPI rank {} of {}", w.rank(), w.size(), world.rank(), world.size()));
    }
    // A ring as a distributed graph: in from left and right, out to left and right.
    let n = w.size();
    let (left, right) = ((w.rank() + n - 1) % n, (w.rank() + 1) % n);
    let ring = w
        .dist_graph_create_adjacent(
            &[left, right],
            fmx::Weights::Unweighted,
            &[left, right],
            fmx::Weights::Unweighted,
            &fmx::Info::new(),
            fmx::Reorder::No,
        )
        .map_err(|e| format!("dist_graph_create_adjacent: {e}"))?;
    // To each neighbour: 1000 * my rank + which neighbour (0 left, 1 right).
    let me = u64::from(w.rank());
    let send = [1000 * me, 1000 * me + 1];
    let mut recv = [0u64; 2];
    ring.neighbor_alltoall(&send, &mut recv).map_err(|e| format!("neighbor_alltoall: {e}"))?;
    // Edges between the same pair match in order (MPI's rule), so the k-th
    // edge from s brings what s sent on its k-th edge to us: on 3+ ranks the
    // left's block for its right and the right's for its left; on 1 or 2
    // ranks, where left == right, the blocks in the order they were sent.
    let dests_of = |s: u32| [(s + n - 1) % n, (s + 1) % n];
    let sources = [left, right];
    let want: Vec<u64> = (0..2)
        .map(|i| {
            let s = sources[i];
            let k = sources[..i].iter().filter(|&&x| x == s).count();
            let j = dests_of(s).iter().enumerate().filter(|(_, &d)| d == w.rank()).nth(k).map_or(0, |(j, _)| j);
            1000 * u64::from(s) + j as u64
        })
        .collect();
    if recv[..] != want[..] {
        return Err(format!("rank {}: neighbor_alltoall gave {recv:?}, expected {want:?}", w.rank()));
    }
    // fmx's allreduce against MPI's on the same ranks.
    let mut fmx_sum = [0u64];
    w.allreduce(&[recv[0] + recv[1]], &mut fmx_sum, fmx::Op::Sum).map_err(|e| format!("allreduce: {e}"))?;
    let mut mpi_sum = 0u64;
    world.all_reduce_into(&(recv[0] + recv[1]), &mut mpi_sum, mpi::collective::SystemOperation::sum());
    if fmx_sum[0] != mpi_sum {
        return Err(format!("rank {}: fmx's allreduce gave {}, MPI's {mpi_sum}", w.rank(), fmx_sum[0]));
    }
    println!(
        "OK fmx-in-mpi rank={} size={} launcher={} transport={} neighbours={recv:?} sum={mpi_sum}",
        w.rank(),
        w.size(),
        fmx.launcher(),
        w.transport_name()
    );
    drop(ring);
    fmx.finalize().map_err(|e| format!("fmx finalize: {e}"))
}

fn main() -> std::process::ExitCode {
    let Some(universe) = mpi::initialize() else {
        eprintln!("FAIL: MPI was already initialized");
        return std::process::ExitCode::FAILURE;
    };
    let world = universe.world();
    let r = run(&world);
    match r {
        Ok(()) => {
            drop(universe); // MPI_Finalize, after fmx's
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("FAIL rank {}: {e}", world.rank());
            world.abort(1)
        }
    }
}
