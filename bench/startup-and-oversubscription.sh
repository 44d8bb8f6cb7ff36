#!/usr/bin/env bash
# Regenerates the start-up and oversubscription figures of README.md:
#   bench/startup-and-oversubscription.sh
# Start-up: whole-process timing (hyperfine) of a 2-rank job that only inits
# and finalizes, under fmxrun and under MPICH's mpiexec.hydra.
# Oversubscription: a ring neighbour exchange on 2 ranks and on 4 ranks
# sharing this machine's cores (release build, fmx's itest rank program).
set -euo pipefail
cd "$(dirname "$0")/.."
need() { command -v "$1" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; }; }
need hyperfine hyperfine
need mpicc.mpich mpich
cargo build -q --release --bin fmxrun --example init_finalize -p fmx
cargo build -q --release -p fmx-itest --bin fmx-itest-rank
mkdir -p bench/peers/build
mpicc.mpich -O2 bench/peers/init_finalize.c -o bench/peers/build/init_finalize_mpich
echo "## start-up, 2 ranks, init + finalize (hyperfine, median)"
hyperfine -N -w 5 -r 40 --export-json /tmp/fmx-startup.json \
  "target/release/fmxrun -n 2 target/release/examples/init_finalize" \
  "mpiexec.hydra -iface lo -n 2 bench/peers/build/init_finalize_mpich" >/dev/null
python3 - <<'PY'
import json
r = json.load(open("/tmp/fmx-startup.json"))["results"]
print("| launcher | median (ms) | mean (ms) |\n|---|---:|---:|")
for x in r:
    name = "fmxrun -n 2" if "fmxrun" in x["command"] else "MPICH mpiexec.hydra -n 2"
    print(f"| {name} | {x['median']*1e3:.1f} | {x['mean']*1e3:.1f} |")
PY
echo
echo "## ring neighbour exchange (sendrecv of 8 B), us per exchange"
echo "| ranks on 2 cores | us/exchange |"
echo "|---:|---:|"
for n in 2 4; do
  us=$(RING_ITERS=20000 target/release/fmxrun -n $n target/release/fmx-itest-rank ring | awk -F'us_per_exchange=' '/RING/{print $2; exit}')
  echo "| $n | $us |"
done
