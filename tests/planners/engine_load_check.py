#!/usr/bin/env python3
"""Checks moe_plan's engine plan files the way the engines check them when they load a plan, with
Python's own json and PyYAML (nothing shared with the C++ writers), and compares each file with the
TSV plan moe_plan wrote next to it: for every MoE layer and expert, the GPUs holding a slot of the
expert must be exactly the GPUs of the TSV plan.

    engine_load_check.py DIR --experts E --ep-size G --hidden-layers H --first-moe D

Every plan_<policy>.<format>.(json|yaml) in DIR with a plan_<policy>.tsv is checked; at least one
file of each format must be present. Exits non-zero with a message naming the file and the field.
"""
import argparse
import glob
import json
import os
import sys

import yaml


def fail(msg):
    print("engine_load_check: " + msg, file=sys.stderr)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def read_tsv_plan(path):
    """{(layer, expert): set of GPUs} from our TSV plan format (docs/plan-format.md)."""
    out = {}
    header = None
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            fields = line.split()
            if header is None:
                expect(fields[0] == "moe-plan", path + ": no moe-plan header")
                header = [int(x) for x in fields[1:]]
                continue
            layer, expert = int(fields[0]), int(fields[1])
            out[(layer, expert)] = set(int(g) for g in fields[2:])
    return header, out


def check_rows(path, rows, experts, ep_size):
    """The MoE rows: equal length P, P divisible by the EP size, integer ids in range, every expert."""
    expect(len(rows) > 0, path + ": no MoE rows")
    P = len(rows[0])
    expect(P % ep_size == 0, "%s: %d slots do not split over %d ranks" % (path, P, ep_size))
    expect(P >= experts, "%s: %d slots for %d experts" % (path, P, experts))
    for l, row in enumerate(rows):
        expect(isinstance(row, list) and len(row) == P, "%s: MoE row %d has not %d slots" % (path, l, P))
        for p, v in enumerate(row):
            expect(is_int(v) and 0 <= v < experts, "%s: MoE row %d slot %d = %r" % (path, l, p, v))
        missing = set(range(experts)) - set(row)
        expect(not missing, "%s: MoE row %d lacks experts %s" % (path, l, sorted(missing)[:5]))
    return P


def compare(path, rows, ep_size, tsv):
    P = len(rows[0])
    S = P // ep_size
    for l, row in enumerate(rows):
        held = {}
        for p, e in enumerate(row):
            held.setdefault(e, set()).add(p // S)
        for e, gpus in held.items():
            expect(tsv[(l, e)] == gpus,
                   "%s: layer %d expert %d on GPUs %s, the TSV plan says %s" % (path, l, e, sorted(gpus), sorted(tsv[(l, e)])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--experts", type=int, required=True)
    ap.add_argument("--ep-size", type=int, required=True)
    ap.add_argument("--hidden-layers", type=int, required=True)
    ap.add_argument("--first-moe", type=int, required=True)
    a = ap.parse_args()
    E, G, H, D = a.experts, a.ep_size, a.hidden_layers, a.first_moe
    seen = {"sglang": 0, "trtllm": 0, "vllm": 0, "vllm-ascend": 0}
    for tsv_path in sorted(glob.glob(os.path.join(a.dir, "plan_*.tsv"))):
        stem = tsv_path[:-4]
        header, tsv = read_tsv_plan(tsv_path)
        expect(header[1] == H - D and header[2] == E and header[3] == G, tsv_path + ": header " + str(header))

        path = stem + ".sglang.json"
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
            # SGLang passes the keys on as keyword arguments: only this one is accepted.
            expect(isinstance(data, dict) and list(data) == ["physical_to_logical_map"], path + ": keys " + str(list(data)))
            rows = data["physical_to_logical_map"]
            expect(isinstance(rows, list) and len(rows) == H, "%s: %d rows, expected %d hidden layers" % (path, len(rows), H))
            P = check_rows(path, rows[D:], E, G)
            for h in range(D):
                expect(rows[h] == [p % E for p in range(P)], "%s: dense row %d is not arange(P) %% E" % (path, h))
            compare(path, rows[D:], G, tsv)
            seen["sglang"] += 1

        path = stem + ".trtllm.yaml"
        if os.path.exists(path):
            with open(path) as f:
                cfg = yaml.safe_load(f)
            expect(isinstance(cfg, dict), path + ": not a mapping")
            expect(set(cfg) == {"num_slots", "initial_global_assignments", "layer_updates_per_iter"}, path + ": keys " + str(sorted(cfg)))
            expect(is_int(cfg["num_slots"]) and cfg["layer_updates_per_iter"] == 0, path + ": num_slots / layer_updates_per_iter")
            ga = cfg["initial_global_assignments"]
            expect(sorted(ga) == list(range(D, H)), path + ": layer keys are not the MoE decoder layers %d..%d" % (D, H - 1))
            rows = [ga[k] for k in range(D, H)]
            P = check_rows(path, rows, E, G)
            expect(P == cfg["num_slots"], path + ": rows are not num_slots long")
            compare(path, rows, G, tsv)
            seen["trtllm"] += 1

        path = stem + ".vllm.json"
        if os.path.exists(path):
            with open(path) as f:
                rows = json.load(f)
            expect(isinstance(rows, list) and len(rows) == H - D, path + ": not [moe layers][P]")
            check_rows(path, rows, E, G)
            compare(path, rows, G, tsv)
            seen["vllm"] += 1

        path = stem + ".vllm-ascend.json"
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
            expect(data["moe_layer_count"] == H - D and len(data["layer_list"]) == H - D, path + ": moe_layer_count")
            rows = []
            for l, layer in enumerate(data["layer_list"]):
                expect(layer["layer_id"] == l and layer["device_count"] == G == len(layer["device_list"]),
                       "%s: layer_list[%d] header" % (path, l))
                row = []
                for g, dev in enumerate(layer["device_list"]):
                    expect(dev["device_id"] == g, "%s: layer %d device %d id" % (path, l, g))
                    row += dev["device_expert"]
                rows.append(row)
            check_rows(path, rows, E, G)
            compare(path, rows, G, tsv)
            seen["vllm-ascend"] += 1
    for fmt, n in seen.items():
        expect(n > 0, "no %s plan checked in %s" % (fmt, a.dir))
    print("engine_load_check: %s ok (%s)" % (a.dir, ", ".join("%s x%d" % kv for kv in seen.items())))


if __name__ == "__main__":
    main()
