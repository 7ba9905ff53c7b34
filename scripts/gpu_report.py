#!/usr/bin/env python3
"""Writes the results file of a GPU run (scripts/gpu_bench.sh) from its results folder.

    python3 scripts/gpu_report.py RESULTS_DIR OUT.md

RESULTS_DIR is the folder gpu_bench.sh writes into ($OUT, or <build>/results). Every input is
optional: a missing or truncated file gives an empty table or a note, so a run that was cut off or
stopped early still yields a results file that says what is missing.

Inputs (all in RESULTS_DIR):
  run.txt                            facts of the run: date, mode, device, commit, host, budget
  steps.tsv                          every step with its cap, budget, time used and status
  cuda-tests.log                     `ctest -L cuda --output-on-failure`
  bench_cuda_moe.json                Google Benchmark JSON of the kernels (a run cut off is repaired);
  bench_cuda_moe.<part>.json         further parts (the layer benchmarks), merged by benchmark name
  torch_baselines.json               PyTorch eager and torch._grouped_mm times, same shapes
  findep_fit_gpu.txt, findep_gpu_models.tsv, findep_fit_status.txt
  bench_cuda_shuffle.json
  bench_cuda_batch_split.json        the per-batch replica split kernel (step `split`)
  torch_split.json                   the same split from PyTorch (step `torch-split`)
"""
import datetime
import json
import os
import sys

# The split kernel's stages, in order, as bench_cuda_batch_split names them in its counters
# (<stage>_cycles, <stage>_share).
# rank_stage_1 / rank_stage_2: in the order bound_first (the default), the tie-breaks at the lower
# bound / the fallback when the bound was below the least max load (its search and the tie-breaks
# again); in the order least_max_first (the /warp_least_max_first rows), the search / the tie-breaks
SPLIT_STAGES = ["counts", "totals", "lists", "start", "rank_stage_1", "rank_stage_2", "sources", "matching"]


def read_text(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def load_bench(path):
    """Google Benchmark JSON; a file cut off mid-run (timeout) is closed after its last whole entry."""
    try:
        text = open(path).read()
    except OSError as exc:
        print("no benchmark results:", exc)
        return {"benchmarks": []}, "missing"
    try:
        return json.loads(text), "complete"
    except ValueError:
        pass
    cut = text.rfind("\n    }")
    if cut >= 0:
        try:
            data = json.loads(text[:cut + 6] + "\n  ]\n}\n")
            return data, "cut off (timeout or crash); the entries before the cut are kept"
        except ValueError:
            pass
    if '"benchmarks": [' in text:
        return {"benchmarks": []}, "cut off (timeout or crash) before the first benchmark finished"
    return {"benchmarks": []}, "unreadable"


def load_bench_parts(results, name):
    """NAME.json and then every NAME.<part>.json (e.g. bench_cuda_moe.layer.json), merged by benchmark name:
    a later part's entry replaces an earlier one of the same name, new names are appended."""
    data, state = load_bench(os.path.join(results, name + ".json"))
    parts = sorted(f for f in os.listdir(results) if f.startswith(name + ".") and f.endswith(".json")
                   and f != name + ".json") if os.path.isdir(results) else []
    if not parts:
        return data, state
    merged = {b["name"]: b for b in data.get("benchmarks", []) if b.get("run_type") != "aggregate"}
    states = [f"{name}.json: {state}"]
    for f in parts:
        d, st = load_bench(os.path.join(results, f))
        states.append(f"{f}: {st}")
        for b in d.get("benchmarks", []):
            if b.get("run_type") != "aggregate":
                merged[b["name"]] = b
    data = dict(data)
    data["benchmarks"] = list(merged.values())
    return data, "merged from " + "; ".join(states)


def load_json(path, name, lines):
    """The JSON file at path, or None when it is absent or unreadable (then a line of the report says so)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as exc:
        lines += ["", f"{name}: {os.path.basename(path)} unreadable ({exc})"]
        return None


def count(v):
    """A tally (a whole number, stored as a float in Google Benchmark's JSON)."""
    return "" if v is None else str(int(round(v)))


def error_note(b):
    """" (ERROR: <message>)" after a benchmark's name when it stopped with an error, else ""."""
    return " (ERROR: " + b.get("error_message", "") + ")" if b.get("error_occurred") else ""


def fmt(v):
    if v is None: return ""
    if isinstance(v, float):
        if v >= 1e6: return f"{v:.3g}"
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return str(v)


def tests_state(results, gpu_run):
    log = read_text(os.path.join(results, "cuda-tests.log"), None)
    if log is None:
        return "NOT RUN (no cuda-tests.log)"
    if not gpu_run:
        return "no GPU: every test skipped or not run, nothing checked (see cuda-tests.log)"
    # A skipped test (exit 77: the CUDA runtime saw no usable device, e.g. a driver older than the
    # toolkit) counts as passed for CTest; here it is a failure to report, not a success.
    if "tests passed, 0 tests failed" in log and "(Skipped)" not in log and "Not Run" not in log:
        summary = [l for l in log.splitlines() if "tests passed" in l]
        return "all passed" + (f" ({summary[-1].strip()})" if summary else "")
    return "FAILED, SKIPPED, TIMED OUT OR NOT BUILT (see cuda-tests.log)"


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print("usage: python3 scripts/gpu_report.py RESULTS_DIR OUT.md", file=sys.stderr)
        sys.exit(0 if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help") else 2)
    results, out = sys.argv[1:3]
    run = {}
    for line in read_text(os.path.join(results, "run.txt")).splitlines():
        key, _, value = line.partition(": ")
        run[key] = value
    day = run.get("date", "")[:10] or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    steps = []
    for line in read_text(os.path.join(results, "steps.tsv")).splitlines()[1:]:
        fields = line.split("\t")
        if len(fields) == 6:
            steps.append(fields)

    data, bench_state = load_bench_parts(results, "bench_cuda_moe")
    cols = ["GB/s", "TFLOP/s", "tokens/s", "of_copy", "of_dense", "of_loop", "of_portable", "max_over_mean",
            "of_uniform"]
    lines = [f"# moe-compose GPU results, {day}", ""]
    mode = run.get("mode", "unknown")
    if not mode.startswith("GPU run"):
        lines += [f"**{mode}: nothing in this file is a measurement.** It shows that the run's steps work "
                  "on this machine; the tables below are empty or hold no-device notes.", ""]
    lines += [f"- {k}: {run[k]}" for k in ("mode", "device", "commit", "date", "host", "budget", "nvcc", "cmake", "targets")
              if k in run]
    lines += [f"- `ctest -L cuda`: {tests_state(results, mode.startswith('GPU run'))}",
              f"- bench_cuda_moe JSON: {bench_state}",
              "- command: scripts/gpu_bench.sh (Google Benchmark with the GPU's time from CUDA events; "
              "docs/gpu.md explains every column)"]
    if steps:
        lines += ["", "## Steps, in the order they ran", "",
                  "Budget: the seconds a step was allowed, the smaller of its cap and the time the run had left.", "",
                  "| step | what | cap (s) | budget (s) | used (s) | status |", "|---|---|---:|---:|---:|---|"]
        for st in steps:
            lines.append("| " + " | ".join(f.replace("|", "\\|") for f in st) + " |")
    lines += ["", "## bench_cuda_moe", "", "| benchmark | kernel | time (us) | " + " | ".join(cols) + " |",
              "|---|---|---:|" + "---:|" * len(cols)]
    ours = {}
    need = {}  # (model, tokens) -> (weight GB, GFLOP) of one Layer forward
    copy_gbs = dense_tflops = None
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate": continue
        name = b["name"].replace("/manual_time", "")
        t = b.get("real_time")
        lines.append(f"| {name} | {b.get('label', '')} | {fmt(t)} | " + " | ".join(fmt(b.get(c)) for c in cols) + " |")
        parts = name.split("/")
        if len(parts) >= 3 and parts[0] in ("Layer", "GroupedGemm") and t is not None:
            ours[(parts[0], parts[1], int(parts[2]))] = t / 1e3  # ms
        if len(parts) >= 3 and parts[0] == "Layer" and b.get("weights_GB") and b.get("GFLOP"):
            need[(parts[1], int(parts[2]))] = (b["weights_GB"], b["GFLOP"])
        if name.startswith("Copy/") and b.get("GB/s"):
            copy_gbs = b["GB/s"]
        if parts[0] == "DenseGemm" and b.get("TFLOP/s"):
            dense_tflops = max(dense_tflops or 0.0, b["TFLOP/s"])
        if len(parts) >= 4 and parts[0] == "GroupedGemmLoad" and t is not None:
            ours[(parts[0], parts[1], parts[2], int(parts[3]))] = t / 1e3
    # Lower bound of a forward on this GPU, from the same run: the larger of reading every weight
    # once at the measured copy bandwidth and doing its FLOPs at the best measured dense rate.
    def bound_ms(m, T):
        if (m, T) not in need or not copy_gbs or not dense_tflops: return None
        gb, gflop = need[(m, T)]
        return max(gb / copy_gbs, gflop / (dense_tflops * 1e3)) * 1e3
    if need:
        lines += ["", "## Layer against its lower bound (same run)", "",
                  f"Bound = max(weight bytes / copy bandwidth {fmt(copy_gbs)} GB/s, FLOPs / best dense rate "
                  f"{fmt(dense_tflops)} TFLOP/s of this run). A practical bound: it holds for kernels that reach at "
                  "most the copy's bandwidth and cuBLAS's dense rate (the hardware peaks are somewhat higher); "
                  "bound / ours is how close the layer comes to it.", "",
                  "| model | tokens | weights (GB) | GFLOP | bound (ms) | our layer (ms) | bound / ours |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for (m, T), (gb, gflop) in sorted(need.items()):
            bd, lay = bound_ms(m, T), ours.get(("Layer", m, T))
            lines.append(f"| {m} | {T} | {fmt(gb)} | {fmt(gflop)} | {fmt(bd)} | {fmt(lay)} | "
                         f"{fmt(bd / lay) if bd and lay else ''} |")
    tj = load_json(os.path.join(results, "torch_baselines.json"), "PyTorch baselines", lines)
    if tj:
        lines += ["", f"## PyTorch baselines (torch {tj['torch']}), same shapes, same run", "",
                  "| model | tokens | eager layer (ms) | grouped_mm layer (ms) | our layer (ms) | vs eager | "
                  "vs grouped_mm | eager / bound | grouped_mm GEMMs (ms) | our grouped GEMM (ms) | "
                  "ours / grouped_mm speed |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in tj["rows"]:
            m, T = r["model"], r["tokens"]
            lay = ours.get(("Layer", m, T)); gg = ours.get(("GroupedGemm", m, T))
            e, g, gm = r.get("eager_ms"), r.get("grouped_mm_layer_ms"), r.get("grouped_mm_gemms_ms")
            ratio = lambda a, b: fmt(a / b) if a and b else ""
            lines.append(f"| {m} | {T} | {fmt(e)} | {fmt(g)} | {fmt(lay)} | {ratio(e, lay)} | {ratio(g, lay)} | "
                         f"{ratio(e, bound_ms(m, T))} | {fmt(gm)} | {fmt(gg)} | {ratio(gm, gg)} |")
        lines += ["", "`eager / bound` is the largest speed-up over the eager loop that an implementation of "
                  "our layer's forward could reach at this run's copy bandwidth and dense rate (previous "
                  "section); where it is below 2, the issue's 2x target is out of reach for that shape whatever "
                  "the kernels."]
        if tj.get("load_rows"):
            lines += ["", "### Grouped GEMMs under real expert loads (GroupedGemmLoad; rows split by the "
                      "recorded corpus counts of tests/data/olmoe-routing)", "",
                      "| model | load | tokens | max/mean load | grouped_mm GEMMs (ms) | ours (ms) | "
                      "ours / grouped_mm speed |", "|---|---|---:|---:|---:|---:|---:|"]
            for r in tj["load_rows"]:
                m, ld, T = r["model"], r["load"], r["tokens"]
                gm, mine = r.get("grouped_mm_gemms_ms"), ours.get(("GroupedGemmLoad", m, ld, T))
                sp = fmt(gm / mine) if gm and mine else ""
                lines.append(f"| {m} | {ld} | {T} | {fmt(r.get('max_over_mean'))} | {fmt(gm)} | {fmt(mine)} | {sp} |")
    lines += ["", "Targets (issue 6): permute/combine of_copy >= 0.8 (Permute: the whole permutation with its "
              "plan, scan and sort; PackRecords: its data-moving kernel alone); grouped GEMM >= 0.9 of torch._grouped_mm and "
              "of_dense >= 0.6 at prefill; layer >= 2x eager and >= 1x grouped_mm.", ""]

    # FinDEP performance models on this GPU (tools/schedule/findep_fit_gpu, docs/findep.md "GPU
    # microbenchmarks").
    fit_status = read_text(os.path.join(results, "findep_fit_status.txt")) or "not run"
    lines += ["", "## FinDEP performance models (findep_fit_gpu)", "",
              f"- status: {fit_status}",
              "- command: tools/schedule/findep_fit_gpu --out findep_gpu_models.tsv --samples findep_gpu_samples.tsv",
              "", "```", read_text(os.path.join(results, "findep_fit_gpu.txt")) or "(no output)", "```"]
    models = read_text(os.path.join(results, "findep_gpu_models.tsv"), None)
    if models is not None:
        lines += ["", "Model file:", "", "```", models, "```"]

    # s-TS on the GPU (include/moe/kernels/shuffle.cuh, docs/speculative.md "GPU predictor and
    # shuffle plan"): predictor lookup + shuffle planning tokens/s against the host predictor of the
    # same run, and pack / unpack GB/s against a device copy.
    sdata, sstate = load_bench(os.path.join(results, "bench_cuda_shuffle.json"))
    scols = ["tokens/s", "of_host", "GB/s", "of_copy"]
    lines += ["", "## s-TS predictor lookup, shuffle plan, pack / unpack (bench_cuda_shuffle)", "",
              f"- bench_cuda_shuffle JSON: {sstate}", "",
              "| benchmark | time (us) | " + " | ".join(scols) + " |", "|---|---:|" + "---:|" * len(scols)]
    for b in sdata.get("benchmarks", []):
        if b.get("run_type") == "aggregate": continue
        lines.append(f"| {b['name'].replace('/manual_time', '')} | {fmt(b.get('real_time'))} | "
                     + " | ".join(fmt(b.get(c)) for c in scols) + " |")

    # The per-batch replica split (include/moe/kernels/batch_split.cuh, docs/results/batch-balance.md):
    # one block from device counts to the split, DeepSeek-V3 at EP32; target 10 us a layer.
    bdata, bstate = load_bench(os.path.join(results, "bench_cuda_batch_split.json"))
    bcols = ["graph_us", "deal_us", "reference_us", "count_us", "plan_us", "dispatch_us", "shared_bytes",
             "fixed_max_over_mean", "split_max_over_mean"]
    lines += ["", "## Per-batch replica split kernel (bench_cuda_batch_split)", "",
              f"- bench_cuda_batch_split JSON: {bstate}",
              "- time: mean of 50 back-to-back launches (CUDA events); graph_us: the same in one CUDA graph; "
              "target (issue 35): 10 us a layer",
              "- DeviceDealSorted: rank 0's pairs put in expert order (CUB sort, beside the split in a layer pass) "
              "and dealt (deal_us: the deal alone, which a pass waits for after the split)",
              "- SlotSplit: the split over an engine's slots (DeviceSlotSplit), rank 0's counts, the split and its "
              "physical slot ids in one CUDA graph; count_us, plan_us, dispatch_us: each alone", "",
              "| benchmark | time (us) | " + " | ".join(bcols) + " |", "|---|---:|" + "---:|" * len(bcols)]
    stages, series, fetch = [], [], []
    for b in bdata.get("benchmarks", []):
        if b.get("run_type") == "aggregate": continue
        if b["name"].startswith("CodeFetch"):
            fetch.append(b)
            continue
        if b["name"].startswith("DeviceSplitStages"):
            stages.append(b)
            continue
        if b["name"].startswith("DeviceSplitSeries"):
            series.append(b)
        err = error_note(b)
        lines.append(f"| {b['name'].replace('/manual_time', '')}{err} | {fmt(b.get('real_time'))} | "
                     + " | ".join(fmt(b.get(c)) for c in bcols) + " |")
    # the rank rounds on one warp against the whole block, same run: the block's graph time over the warp's
    times = {}
    for b in bdata.get("benchmarks", []):
        parts = b["name"].replace("/manual_time", "").split("/")
        if b.get("run_type") != "aggregate" and parts[0] == "DeviceSplit" and len(parts) == 3 and not b.get("error_occurred"):
            times[(parts[1], parts[2])] = b.get("graph_us") or b.get("real_time")
    pairs = [(t, times[(t, "block")] / times[(t, "warp")]) for t, v in times if v == "warp" and times.get((t, "block"))
             and times[(t, "warp")]]
    if pairs:
        lines += ["", "Rank rounds on one warp against the whole block (the block's graph_us over the warp's; > 1: the "
                  "warp is faster): " + ", ".join(f"{t} tokens {fmt(r)}" for t, r in pairs)]
    # the tie-breaks' packed labels against the two-stage rounds they replaced, both on one warp
    pairs = [(t, times[(t, "warp_two_stage")] / times[(t, "warp")]) for t, v in times
             if v == "warp" and times.get((t, "warp_two_stage")) and times[(t, "warp")]]
    if pairs:
        lines += ["", "Tie-breaks' packed labels against the two-stage rounds, on one warp (warp_two_stage's graph_us "
                  "over warp's; > 1: the packed labels are faster): " + ", ".join(f"{t} tokens {fmt(r)}" for t, r in pairs)]
    # the two orders of the rank-sized stages (the same split): least_max_first's graph_us over bound_first's
    pairs = [(t, times[(t, "warp_least_max_first")] / times[(t, "warp")]) for t, v in times
             if v == "warp" and times.get((t, "warp_least_max_first")) and times[(t, "warp")]]
    if pairs:
        lines += ["", "The lower bound's tie-breaks first against the least max load's search first, on one warp "
                  "(warp_least_max_first's graph_us over warp's; > 1: bound first is faster): "
                  + ", ".join(f"{t} tokens {fmt(r)}" for t, r in pairs)]
    if series:
        # the means over the scenario's series of seeded batches (one batch can be a lucky or unlucky draw)
        lines += ["", "Over the series of seeded batches (DeviceSplitSeries: one split per batch in turn in one CUDA "
                  "graph; means per split):", "",
                  "| tokens | batches | graph_us | thread 0's cycles | fallbacks | least max load: searches / rounds "
                  "| tie-breaks: searches / rounds |", "|---|---:|---:|---:|---:|---:|---:|"]
        for b in series:
            err = error_note(b)
            lines.append(f"| {b['name'].replace('/manual_time', '').split('/')[1]}{err} | {count(b.get('batches'))} "
                         f"| {fmt(b.get('real_time'))} | {fmt(b.get('all_cycles'))} | {fmt(b.get('fallbacks'))} "
                         f"| {fmt(b.get('max_load_searches'))} / {fmt(b.get('max_load_rounds'))} "
                         f"| {fmt(b.get('tie_break_searches'))} / {fmt(b.get('tie_break_rounds'))} |")
        # where the series' time goes: thread 0's clock64 after each stage, a second split of each batch
        lines += ["", "The series' stages (mean SM cycles per split; thread 0's clock64 after each stage, from a "
                  "second split of each batch):", "",
                  "| tokens | " + " | ".join(SPLIT_STAGES) + " | all |", "|---|" + "---:|" * (len(SPLIT_STAGES) + 1)]
        for b in series:
            lines.append(f"| {b['name'].replace('/manual_time', '').split('/')[1]} | "
                         + " | ".join(fmt(b.get(n + "_cycles")) for n in SPLIT_STAGES) + f" | {fmt(b.get('all_cycles'))} |")
    if stages:
        lines += ["", "Where a split's time goes (DeviceSplitStages: thread 0's clock64 after each stage, mean of "
                  "50 splits; share of the whole, and the whole in SM cycles):", "",
                  "| tokens / rounds | " + " | ".join(SPLIT_STAGES) + " | all (cycles) |",
                  "|---|" + "---:|" * (len(SPLIT_STAGES) + 1)]
        for b in stages:
            lines.append(f"| {' / '.join(b['name'].split('/')[1:3])} | "
                         + " | ".join(fmt(b.get(n + "_share")) for n in SPLIT_STAGES) + f" | {fmt(b.get('all_cycles'))} |")
        # the kernel's tallies of the same splits: what the rank-sized rounds cost each
        if any("tie_break_rounds" in b for b in stages):
            lines += ["", "The rank-sized rounds of those splits (the kernel's tallies; the fallback: the lower bound was "
                      "below the least max load) and, without the fallback, the tie-breaks' cycles per round:", "",
                      "| tokens / rounds | fallback | least max load: searches / rounds "
                      "| tie-breaks: searches / rounds | cycles per round |", "|---|---:|---:|---:|---:|"]
            for b in stages:
                lines.append(f"| {' / '.join(b['name'].split('/')[1:3])} | {count(b.get('fallbacks'))} "
                             f"| {count(b.get('max_load_searches'))} / {count(b.get('max_load_rounds'))} "
                             f"| {count(b.get('tie_break_searches'))} / {count(b.get('tie_break_rounds'))} "
                             f"| {fmt(b.get('tie_break_cycles_per_round'))} |")
    if fetch:
        # what code run once costs a one-block kernel (the model of batch-balance.md, "The kernel's code")
        lines += ["", "Code run once (CodeFetch: a straight-line body of that many KiB run twice in one launch of one block; "
                  "thread 0's cycles per pass, mean of 50 launches; fetch = first pass minus second):", "",
                  "| KiB / warps (/ L2 evicted) | first pass | first pass, least | second pass | first pass per KiB "
                  "| fetch per KiB |", "|---|---:|---:|---:|---:|---:|"]
        for b in fetch:
            err = error_note(b)
            lines.append(f"| {' / '.join(b['name'].split('/')[1:])}{err} | {fmt(b.get('first_pass_cycles'))} "
                         f"| {fmt(b.get('first_pass_min_cycles'))} | {fmt(b.get('second_pass_cycles'))} "
                         f"| {fmt(b.get('first_pass_cycles_per_kib'))} | {fmt(b.get('fetch_cycles_per_kib'))} |")
    # the same split from PyTorch (scripts/gpu_torch_split.py, step torch-split)
    ts = load_json(os.path.join(results, "torch_split.json"), "The split from PyTorch", lines)
    if ts:
        lines += ["", f"## The split from PyTorch (moe_compose.device, torch {ts['torch']})", "",
                  "DeepSeek-V3's 256 experts on 32 GPUs of 9 slots (synthetic, seeded); graph_us: rank 0's count, "
                  "plan and dispatch in a CUDA graph, per layer; eager_us: the three calls from Python.", "",
                  "| tokens per rank | graph_us | eager_us | max load | mean load | first copy's max | checks |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
        for r in ts["rows"]:
            lines.append(f"| {r['tokens']} | {fmt(r.get('graph_us'))} | {fmt(r.get('eager_us'))} | "
                         f"{count(r.get('max_load'))} | {fmt(r.get('mean_load'))} | {count(r.get('first_copy_max'))} | "
                         f"{r.get('checks', '')} |")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
