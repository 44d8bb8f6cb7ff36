#!/usr/bin/env bash
# Creates an rxe device on FMX_RXE_NETDEV (default: the default route's
# interface) unless one exists, then runs the verbs suites: the same as the
# Soft-RoCE VM harness runs, on the host kernel's rdma_rxe.
set -euo pipefail
if ! ls /sys/class/infiniband 2>/dev/null | grep -q .; then
    dev=${FMX_RXE_NETDEV:-$(ip route show default | awk '{print $5; exit}')}
    rdma link add rxe0 type rxe netdev "$dev"
fi
ibv_devinfo -l
export FMX_VERBS_DEVICE=${FMX_VERBS_DEVICE:-$(ls /sys/class/infiniband | head -1)}
/src/target/release/fmx-verbs-probe
cd /src
cargo test --release --features fmx/verbs -p fmx-verbs -- --include-ignored --test-threads=1
FMX_ITEST_TRANSPORT=verbs cargo test --release --features fmx/verbs -p fmx-itest -- --test-threads=1
if [[ ${1:-} == --bench ]]; then
    target/release/fmx-perf latency --transport verbs --max-size 4096
    target/release/fmx-perf bw --transport verbs --min-size 4096
fi
