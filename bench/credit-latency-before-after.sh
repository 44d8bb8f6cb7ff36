#!/usr/bin/env bash
# Eager latency of fmx-perf before the credit layer and now, alternating in one
# run (median of 5 runs each), for the README's flow-control section:
#   bench/credit-latency-before-after.sh [BASE_COMMIT]
# BASE_COMMIT defaults to 01860c0, the last commit before credits.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-01860c0}
wt=target/before-credits
[ -d "$wt" ] || git worktree add -q --detach "$wt" "$base"
(cd "$wt" && CARGO_TARGET_DIR="$PWD/../before-credits-target" cargo build -q --release --bin fmx-perf)
cargo build -q --release --bin fmx-perf
before=target/before-credits-target/release/fmx-perf
now=target/release/fmx-perf
declare -A B N
for round in 1 2 3 4 5; do
  while read -r size v; do B[$size]+="$v "; done < <($before latency --max-size 64 | grep -v '^#')
  while read -r size v; do N[$size]+="$v "; done < <($now latency --max-size 64 | grep -v '^#')
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| size | before credits (us) | with credits (us) | change |"
echo "|---:|---:|---:|---:|"
for size in 1 8 64; do
  b=$(echo "${B[$size]}" | median); n=$(echo "${N[$size]}" | median)
  awk -v s="$size" -v b="$b" -v n="$n" 'BEGIN { printf "| %d B | %.3f | %.3f | %+.1f%% |\n", s, b, n, (n - b) / b * 100 }'
done
