#!/usr/bin/env python3
"""Reads the Soft-RoCE VM's serial log: one line per suite and per test,
the capability table and benchmark output saved beside it; exit 0 only if
the VM finished, every suite passed and at least one test ran in each."""
import re
import sys

log, out = sys.argv[1], sys.argv[2]
lines = open(log, errors="replace").read().splitlines()
suite, results, tests, caps, bench, section = None, {}, [], [], [], None
extra_rows = []
yama = []
done = None
for line in lines:
    m = re.match(r"FMX-VM begin (\S+)", line)
    if m:
        suite = m.group(1)
        continue
    m = re.match(r"FMX-VM result (\S+) (pass|fail)(.*)", line)
    if m:
        if results.get(m.group(1), ("pass",))[0] == "pass":  # repeated suites: any failure counts
            results[m.group(1)] = (m.group(2), m.group(3).strip())
        continue
    m = re.match(r"FMX-VM done rc=(\d+)", line)
    if m:
        done = int(m.group(1))
        continue
    if line.startswith(("FMX-VM counters", "FMX-VM netns", "FMX-VM fi_info")):
        print(line[len("FMX-VM "):])
    if line.startswith("FMX-YAMA-ROW "):
        yama.append(line[len("FMX-YAMA-ROW "):])
        continue
    if line.startswith("FMX-CAPS-ROW "):
        extra_rows.append(line[len("FMX-CAPS-ROW "):])
        continue
    if line in ("FMX-CAPS-BEGIN", "FMX-BENCH-BEGIN"):
        section = caps if "CAPS" in line else bench
        continue
    if line in ("FMX-CAPS-END", "FMX-BENCH-END"):
        section = None
        continue
    if section is not None:
        section.append(line)
    m = re.match(r"test (\S+) \.\.\. (ok|FAILED|ignored)", line)
    if m and suite:
        tests.append((suite, m.group(1), m.group(2)))

for s, name, st in tests:
    print(f"{'PASS' if st == 'ok' else st.upper():7} {s} :: {name}")
ok = done == 0
for name, (st, why) in results.items():
    n = sum(1 for s, _, _ in tests if s == name)
    extra = f" ({n} tests)" if n else ""
    print(f"{'PASS' if st == 'pass' else 'FAIL':7} suite {name}{extra} {why}".rstrip())
    ok &= st == "pass"
bench_only = open(f"{out}/initramfs/fmx/bench").read().strip() == "2"
only = open(f"{out}/initramfs/fmx/only").read().strip()
for required in ("setup", "probe") + (("bench",) if bench_only else () if only else ("fmx-itest/multiprocess", "fmx-verbs/device_pair", "shm-yama", "tools-and-errors")):
    if required not in results:
        print(f"MISSING suite {required}")
        ok = False
suites_with_tests = {s for s, _, _ in tests}
for name in results:
    if name.startswith(("fmx-verbs/", "fmx-itest/")) and name not in suites_with_tests and not only:
        print(f"FAIL    suite {name} ran no test")
        ok = False
if any(st == "FAILED" for _, _, st in tests):
    ok = False
for row in extra_rows:  # measured outside the probe: replaces the probe's row of that name
    name = row.split("|")[1].strip()
    caps = [row if c.startswith("|") and c.split("|")[1].strip() == name else c for c in caps]
if caps:
    open(f"{out}/capabilities.md", "w").write("\n".join(caps) + "\n")
    print(f"capability table: {out}/capabilities.md")
if yama:
    table = ["| ptrace_scope | large messages over shm (unprivileged ranks) | bw 4 MiB, MB/s |", "|---|---|---|"] + yama
    open(f"{out}/yama.md", "w").write("\n".join(table) + "\n")
    print("\n".join(table))
if bench:
    open(f"{out}/bench.txt", "w").write("\n".join(bench) + "\n")
    print("\n".join(bench))
if done is None:
    print("the VM did not finish (no 'FMX-VM done' line)")
print("rxe-vm: " + ("all tests passed" if ok else "FAILED"))
sys.exit(0 if ok else 1)
