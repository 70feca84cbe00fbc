#!/usr/bin/env python3
"""The sizing matrix of README "Sizing a sale": `tokenlease simulate` at P in {4, 16, 64, 256, 1000} x demand
{1.1, 1.5, 3, 10, 100} times the shipped rate, spread evenly and skewed, for 10 s and 60 s, two runs at a time.

Usage: python3 scripts/sizing-matrix.py [BINARY] [DURATIONS]   (default target/release/tokenlease, 10s,60s)
Prints one row per P: each cell `sold 10 s/60 s %, worst window, steady ops/s (leases/give-backs/checks/beats);
calls per admitted token from 3 s`, then the lowest cell of each duration."""
import concurrent.futures as cf
import json
import subprocess
import sys

BINARY = sys.argv[1] if len(sys.argv) > 1 else "target/release/tokenlease"
DURATIONS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["10s", "60s"]
PROCESSES = [4, 16, 64, 256, 1000]
TIMES_RATE = [1.1, 1.5, 3, 10, 100]
RATE = 1000  # the shipped sku_buy's


def run(p, m, skew, duration):
    args = [BINARY, "simulate", "--processes", str(p), "--demand", str(int(RATE * m)), "--duration", duration, "--json"]
    if skew:
        args.append("--skew")
    out = subprocess.run(args, capture_output=True, text=True, check=False).stdout
    return (p, m, skew, duration), json.loads(out.strip().splitlines()[-1])


def main():
    jobs = [(p, m, s, d) for s in (False, True) for p in PROCESSES for m in TIMES_RATE for d in DURATIONS]
    with cf.ThreadPoolExecutor(2) as pool:
        res = dict(pool.map(lambda job: run(*job), jobs))
    for skew in (False, True):
        for p in PROCESSES:
            cells = []
            for m in TIMES_RATE:
                sold = "/".join(f"{res[(p, m, skew, d)]['sold_of_could_pct']:.1f}" for d in DURATIONS)
                worst = max(res[(p, m, skew, d)]["worst_window_ratio"] for d in DURATIONS)
                r = res[(p, m, skew, DURATIONS[0])]
                o = r["steady_ops_per_s"]
                ops = f"{o['all']:.0f} ({o['lease']:.0f}/{o['give_back']:.0f}/{o['check']:.0f}/{o['beat']:.0f})"
                cells.append(f"{sold} w{worst:.3f} {ops}; {r['steady_calls_per_admitted']:.4f}")
            print(("skewed: " if skew else "") + str(p), "|", " | ".join(cells))
    for d in DURATIONS:
        low = min(res[(p, m, s, d)]["sold_of_could_pct"] for p in PROCESSES for m in TIMES_RATE for s in (False, True))
        print(f"lowest {d}: {low:.1f} %")


if __name__ == "__main__":
    main()
