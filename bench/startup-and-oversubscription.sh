#!/usr/bin/env bash
# Regenerates the start-up and oversubscription figures of README.md:
#   bench/startup-and-oversubscription.sh
# Start-up: whole-process timing (hyperfine) of a 4-rank job that only inits
# and finalizes, under fmxrun, Hydra (PMI-1, PMI-2), Open MPI's mpirun (PMIx,
# a build with the `pmix` feature in target/pmix) and, when run inside
# scripts/slurm-test, srun --mpi=pmi2 and --mpi=pmix; beside MPICH's
# MPI_Init+MPI_Finalize under Hydra.
# Oversubscription: a ring neighbour exchange on 2 ranks and on 4 ranks
# sharing this machine's cores (release build, fmx's itest rank program).
set -euo pipefail
cd "$(dirname "$0")/.."
need() { command -v "$1" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; }; }
need hyperfine hyperfine
need mpicc.mpich mpich
cargo build -q --release --bin fmxrun --example init_finalize -p fmx -p fmx-launcher
cargo build -q --release -p fmx-itest --bin fmx-itest-rank
CARGO_TARGET_DIR=target/pmix cargo build -q --release -p fmx --features pmix --example init_finalize
MPICC=mpicc.mpich CARGO_TARGET_DIR=target/mpich cargo build -q --release -p fmx-mpi-bootstrap
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p bench/peers/build
mpicc.mpich -O2 bench/peers/init_finalize.c -o bench/peers/build/init_finalize_mpich
mpicc.openmpi -O2 bench/peers/init_finalize.c -o bench/peers/build/init_finalize_openmpi
echo "## start-up, 4 ranks, init + finalize (hyperfine, median of 20)"
cmds=(
  "target/release/fmxrun -n 4 target/release/examples/init_finalize"
  "mpiexec.hydra -launcher fork -iface lo -n 4 target/release/examples/init_finalize"
  "env FMX_PMI=2 mpiexec.hydra -launcher fork -iface lo -n 4 target/release/examples/init_finalize"
  "mpirun.openmpi --oversubscribe --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -np 4 target/pmix/release/examples/init_finalize"
)
# srun needs Slurm's daemons: run this script as
# `scripts/slurm-test -- bench/startup-and-oversubscription.sh` to include it.
[[ -n "${SLURM_CONF:-}" ]] && cmds+=("srun --mpi=pmi2 -n 4 target/release/examples/init_finalize"
    "srun --mpi=pmix -n 4 target/pmix/release/examples/init_finalize")
cmds+=("env UCX_NET_DEVICES=lo mpiexec.hydra -launcher fork -iface lo -n 4 target/mpich/release/fmx-mpi-bootstrap")
cmds+=("env UCX_NET_DEVICES=lo mpiexec.hydra -launcher fork -iface lo -n 4 bench/peers/build/init_finalize_mpich")
cmds+=("mpirun.openmpi --oversubscribe --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -np 4 bench/peers/build/init_finalize_openmpi")
hyperfine -N -w 3 -r 20 --export-json /tmp/fmx-startup.json "${cmds[@]}" >/dev/null
python3 - <<'PY'
import json
r = json.load(open("/tmp/fmx-startup.json"))["results"]
names = {
    "fmxrun": "fmx under fmxrun",
    "FMX_PMI=2": "fmx under Hydra, PMI-2",
    "--mpi=pmi2": "fmx under Slurm srun --mpi=pmi2",
    "--mpi=pmix": "fmx under Slurm srun --mpi=pmix (PMIx)",
    "fmx-mpi-bootstrap": "fmx inside MPICH (rsmpi example: MPI_Init, fmx through MPI, a ring exchange, both finalize)",
    "init_finalize_mpich": "MPICH MPI_Init+MPI_Finalize under Hydra (peer)",
    "init_finalize_openmpi": "Open MPI MPI_Init+MPI_Finalize under mpirun (peer)",
    "mpirun.openmpi": "fmx under Open MPI mpirun (PMIx)",
}
def name(cmd):
    for k, v in names.items():
        if k in cmd:
            return v
    return "fmx under Hydra, PMI-1"
peer = next(x for x in r if "init_finalize_mpich" in x["command"])["median"]
print("| launcher, 4 ranks | median (ms) | mean (ms) | MPICH / this |\n|---|---:|---:|---:|")
for x in r:
    print(f"| {name(x['command'])} | {x['median']*1e3:.1f} | {x['mean']*1e3:.1f} | {peer/x['median']:.2f}x |")
PY
echo
echo "## ring neighbour exchange (sendrecv of 8 B), us per exchange"
echo "| ranks on 2 cores | us/exchange |"
echo "|---:|---:|"
for n in 2 4; do
  us=$(RING_ITERS=20000 target/release/fmxrun -n $n target/release/fmx-itest-rank ring | awk -F'us_per_exchange=' '/RING/{print $2; exit}')
  echo "| $n | $us |"
done
