#!/usr/bin/env python3
"""Passes around each re-plan against their neighbours, from a live_layer_study --pass-log file.

For every (model, strategy) of the log and every re-plan boundary b = k x every (k >= 1), the wall
time of pass b + off divided by the median wall time of the passes within `reach` of it, leaving
out the passes b - 2 .. b + 8 of every boundary, minus one; printed per offset as the median over
the boundaries. Also the spread of plain passes (no migration step) against their own
neighbours, to show how much a single pass says. docs/results/serving-loop-layer.md, "What the
hold-up column leaves out", is this script's output.

    python3 scripts/pass_log_neighbours.py inproc8-passes.tsv [--every 100] [--reach 20]
"""
import argparse
import collections
import csv
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="a --pass-log file of tools/planner/live_layer_study")
    ap.add_argument("--every", type=int, default=100, help="the study's --replan-every (default 100)")
    ap.add_argument("--reach", type=int, default=20, help="neighbours within this many passes (default 20)")
    a = ap.parse_args()
    try:
        rows = list(csv.DictReader(open(a.log), delimiter="\t"))
    except OSError as e:
        sys.exit(f"pass_log_neighbours: cannot read {a.log}: {e.strerror}")
    need = {"model", "strategy", "pass", "wall_s", "migration_s"}
    if not rows or not need <= set(rows[0]):
        sys.exit(f"pass_log_neighbours: {a.log}: not a pass log (needs the columns {', '.join(sorted(need))})")
    runs = collections.defaultdict(list)
    for line, r in enumerate(rows, start=2):
        try:
            runs[(r["model"], r["strategy"])].append((int(r["pass"]), float(r["wall_s"]), float(r["migration_s"])))
        except ValueError:
            sys.exit(f"pass_log_neighbours: {a.log}:{line}: a pass, wall_s or migration_s that is not a number")
    offsets = range(-2, 3)
    print("model\tstrategy\t" + "\t".join(f"pass b{o:+d}" for o in offsets) + "\tplain p50/p90/p99")
    for (model, strategy), v in runs.items():
        v.sort()
        wall = [w for _, w, _ in v]
        mig = [m for _, _, m in v]
        n = len(v)
        def near_boundary(j):  # one of the passes b - 2 .. b + 8 of a boundary b
            return j % a.every <= 8 or j % a.every >= a.every - 2
        cells = []
        for off in offsets:
            ratios = []
            for b in range(a.every, n, a.every):
                i = b + off
                if not 0 <= i < n:
                    continue
                nb = [wall[j] for j in range(max(0, i - a.reach), min(n, i + a.reach + 1))
                      if j != i and not near_boundary(j)]
                if nb:
                    ratios.append(wall[i] / statistics.median(nb) - 1)
            cells.append(f"{100 * statistics.median(ratios):+.0f} %" if ratios else "-")
        plain = []
        for i in range(n):
            if mig[i] > 0:
                continue
            nb = [wall[j] for j in range(max(0, i - 10), min(n, i + 11)) if j != i and mig[j] == 0]
            if nb:
                plain.append(wall[i] / statistics.median(nb) - 1)
        plain.sort()
        q = lambda p: 100 * plain[min(len(plain) - 1, int(p * len(plain)))] if plain else float("nan")
        print(f"{model}\t{strategy}\t" + "\t".join(cells) + f"\t{q(.5):.0f}/{q(.9):.0f}/{q(.99):.0f} %")


if __name__ == "__main__":
    main()
