#!/usr/bin/env bash
# Builds the CUDA tests and benchmarks for Hopper (sm_90a), runs the `cuda` tests and the GPU
# benchmarks, and writes a dated results table to docs/cuda-results-<UTC date>.md.
#
#   scripts/gpu_bench.sh                    # everything
#   BENCH_FILTER='Layer|GroupedGemm' scripts/gpu_bench.sh
#   SKIP_TORCH=1 scripts/gpu_bench.sh       # no PyTorch baselines
#
# Environment: BUILD_DIR (default build-gpu), JOBS (default nproc), BENCH_FILTER (Google Benchmark
# regex, default all), BENCH_MIN_TIME (seconds per benchmark, default 0.2), SKIP_TORCH.
# Needs a GPU (nvidia-smi), CMake >= 3.24, nvcc, Catch2 v2 and Google Benchmark; PyTorch is optional
# (eager loop-over-experts and torch._grouped_mm baselines on the same shapes).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
jobs=${JOBS:-$(nproc)}
filter=${BENCH_FILTER:-.}
min_time=${BENCH_MIN_TIME:-0.2}
day=$(date -u +%Y-%m-%d)
out=$root/docs/cuda-results-$day.md

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_bench.sh: no GPU (nvidia-smi failed); nothing to measure" >&2
  exit 1
fi
device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)

# Hopper only: sm_90a (wgmma/TMA capable). CMAKE_CUDA_ARCHITECTURES=OFF so that CMake adds no
# architecture flags of its own. The CUDA20 options teach CMake < 3.26 nvcc's -std=c++20.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=OFF \
  "-DCMAKE_CUDA_FLAGS=-gencode=arch=compute_90a,code=sm_90a" \
  -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20
# Tests and benchmark are built separately: a machine without Catch2 or Google Benchmark (the
# targets then do not exist) still gets the other half and a results table that says what is missing.
tests_ok=1
rm -f "$build/cuda-tests.log"
if cmake --build "$build" -j "$jobs" --target test_cuda_instantiate test_cuda_kernels test_cuda_layer test_findep_cuda test_cuda_shuffle; then
  (cd "$build" && ctest -L cuda --output-on-failure 2>&1) | tee "$build/cuda-tests.log" || tests_ok=0
  grep -q "tests passed, 0 tests failed" "$build/cuda-tests.log" || tests_ok=0
  # A skipped test (exit 77: the CUDA runtime saw no usable device, e.g. a driver older than the
  # toolkit) counts as passed for CTest; here it is a failure to report, not a success.
  if grep -q "(Skipped)" "$build/cuda-tests.log"; then tests_ok=0; fi
else
  echo "gpu_bench.sh: the cuda tests did not build (Catch2 missing?)" >&2
  tests_ok=0
fi

rm -f "$build/bench_cuda_moe.json"
if cmake --build "$build" -j "$jobs" --target bench_cuda_moe; then
  "$build/benchmarks/cuda/bench_cuda_moe" --benchmark_filter="$filter" --benchmark_min_time="$min_time" \
    --benchmark_out="$build/bench_cuda_moe.json" --benchmark_out_format=json | tee "$build/bench_cuda_moe.txt" ||
    echo "gpu_bench.sh: bench_cuda_moe failed; the table keeps what it wrote" >&2
else
  echo "gpu_bench.sh: bench_cuda_moe did not build (Google Benchmark missing?)" >&2
fi

torch_json=$build/torch_baselines.json
rm -f "$torch_json"
if [[ -z "${SKIP_TORCH:-}" ]] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 - "$torch_json" <<'PY' || echo "torch baselines failed (see above)"
# PyTorch baselines on the benchmark's shapes: eager loop over experts, and torch._grouped_mm.
import json, math, sys, torch
import torch.nn.functional as F

shapes = {  # name: hidden, expert_ffn, experts, top_k
    "Mixtral-8x7B": (4096, 14336, 8, 2),
    "DeepSeek-V3": (7168, 2048, 256, 8),
    "Qwen3-30B-A3B": (2048, 768, 128, 8),
}
dev = torch.device("cuda")

def timed(fn, reps=10):
    fn(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): fn()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) / reps  # ms

rows = []
for name, (h, f, E, k) in shapes.items():
    g = torch.Generator(device=dev).manual_seed(1)
    w1 = (torch.rand(E, f, h, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1) / math.sqrt(h)
    w3 = (torch.rand(E, f, h, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1) / math.sqrt(h)
    w2 = (torch.rand(E, h, f, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1) / math.sqrt(f)
    router = (torch.rand(E, h, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1) / math.sqrt(h)
    for T in (128, 4096, 16384):
        x = torch.randn(T, h, device=dev, generator=g, dtype=torch.bfloat16)
        def route():
            p = torch.softmax((x @ router.t()).float(), dim=-1)
            wts, ids = torch.topk(p, k, dim=-1)
            return ids, wts
        def eager():
            ids, wts = route()
            y = torch.zeros(T, h, device=dev, dtype=torch.float32)
            for e in range(E):
                tok, slot = (ids == e).nonzero(as_tuple=True)
                if tok.numel() == 0: continue
                xe = x[tok]
                o = (F.silu(xe @ w1[e].t()) * (xe @ w3[e].t())) @ w2[e].t()
                y.index_add_(0, tok, o.float() * wts[tok, slot, None])
            return y.to(torch.bfloat16)
        def grouped_parts():
            ids, wts = route()
            flat = ids.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = torch.bincount(flat, minlength=E)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            tok = order // k
            return tok, order, offs, wts.reshape(-1)[order]
        def grouped_gemms(xs, offs):
            a = torch._grouped_mm(xs, w1.transpose(-2, -1), offs=offs)
            b = torch._grouped_mm(xs, w3.transpose(-2, -1), offs=offs)
            return torch._grouped_mm(F.silu(a) * b, w2.transpose(-2, -1), offs=offs)
        def grouped():
            tok, order, offs, ws = grouped_parts()
            o = grouped_gemms(x[tok], offs)
            y = torch.zeros(T, h, device=dev, dtype=torch.float32)
            y.index_add_(0, tok, o.float() * ws[:, None])
            return y.to(torch.bfloat16)
        flops = 6.0 * T * k * h * f
        row = {"model": name, "tokens": T}
        for label, fn in (("eager_ms", eager), ("grouped_mm_layer_ms", grouped)):
            try:
                row[label] = timed(fn, 3 if label == "eager_ms" else 10)
            except Exception as exc:  # report, keep going
                row[label] = None; row[label + "_error"] = str(exc)[:200]
        try:
            tok, order, offs, ws = grouped_parts(); xs = x[tok]
            ms = timed(lambda: grouped_gemms(xs, offs))
            row["grouped_mm_gemms_ms"] = ms
            row["grouped_mm_tflops"] = flops / (ms / 1e3) / 1e12
        except Exception as exc:
            row["grouped_mm_gemms_ms"] = None; row["grouped_mm_error"] = str(exc)[:200]
        rows.append(row)
        print(row, flush=True)
    del w1, w2, w3
    torch.cuda.empty_cache()
json.dump({"torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
PY
fi

python3 - "$build/bench_cuda_moe.json" "$torch_json" "$out" "$device" "$day" "$tests_ok" \
  "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, os, sys
bench_path, torch_path, out, device, day, tests_ok, commit = sys.argv[1:8]
try:
    data = json.load(open(bench_path))
except (OSError, ValueError) as exc:  # crashed or filtered run: still write what we know
    print("no benchmark results:", exc)
    data = {"benchmarks": []}
cols = ["GB/s", "TFLOP/s", "tokens/s", "of_copy", "of_dense", "of_loop"]
def fmt(v):
    if v is None: return ""
    if isinstance(v, float):
        if v >= 1e6: return f"{v:.3g}"
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return str(v)
lines = [f"# CUDA results, {day}", "",
         f"- device: {device}", f"- commit: {commit}",
         f"- `ctest -L cuda`: {'all passed' if tests_ok == '1' else 'FAILED, SKIPPED OR NOT BUILT (see cuda-tests.log in the build folder)'}",
         f"- command: scripts/gpu_bench.sh (bench_cuda_moe, Google Benchmark, manual GPU time via CUDA events)", "",
         "| benchmark | time (us) | " + " | ".join(cols) + " |",
         "|---|---:|" + "---:|" * len(cols)]
ours = {}
for b in data.get("benchmarks", []):
    if b.get("run_type") == "aggregate": continue
    name = b["name"].replace("/manual_time", "")
    t = b.get("real_time")
    lines.append(f"| {name} | {fmt(t)} | " + " | ".join(fmt(b.get(c)) for c in cols) + " |")
    parts = name.split("/")
    if len(parts) >= 3 and parts[0] in ("Layer", "GroupedGemm"):
        ours[(parts[0], parts[1], int(parts[2]))] = t / 1e3  # ms
if os.path.exists(torch_path):
    tj = json.load(open(torch_path))
    lines += ["", f"## PyTorch baselines (torch {tj['torch']}), same shapes, same run", "",
              "| model | tokens | eager layer (ms) | grouped_mm layer (ms) | our layer (ms) | vs eager | vs grouped_mm | "
              "grouped_mm GEMMs (ms) | our grouped GEMM (ms) | ours / grouped_mm speed |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in tj["rows"]:
        m, T = r["model"], r["tokens"]
        lay = ours.get(("Layer", m, T)); gg = ours.get(("GroupedGemm", m, T))
        e, g, gm = r.get("eager_ms"), r.get("grouped_mm_layer_ms"), r.get("grouped_mm_gemms_ms")
        ratio = lambda a, b: fmt(a / b) if a and b else ""
        lines.append(f"| {m} | {T} | {fmt(e)} | {fmt(g)} | {fmt(lay)} | {ratio(e, lay)} | {ratio(g, lay)} | "
                     f"{fmt(gm)} | {fmt(gg)} | {ratio(gm, gg)} |")
lines += ["", "Targets (issue 6): permute/combine of_copy >= 0.8; grouped GEMM >= 0.9 of torch._grouped_mm and "
          "of_dense >= 0.6 at prefill; layer >= 2x eager and >= 1x grouped_mm.", ""]
open(out, "w").write("\n".join(lines))
print("wrote", out)
PY

# FinDEP performance models on this GPU (examples/schedule/findep_fit_gpu, docs/findep.md "GPU
# microbenchmarks"): measures, fits, writes the model file, and its table goes into the results file.
# A failed run or an R^2 below 0.99 is reported in the table and does not stop the script.
fit_status="did not build"
rm -f "$build/findep_gpu_models.tsv" "$build/findep_gpu_samples.tsv" "$build/findep_fit_gpu.txt"
if cmake --build "$build" -j "$jobs" --target findep_fit_gpu; then
  if "$build/examples/schedule/findep_fit_gpu" --out "$build/findep_gpu_models.tsv" \
      --samples "$build/findep_gpu_samples.tsv" 2>&1 | tee "$build/findep_fit_gpu.txt"; then
    fit_status="all six models reach R^2 >= 0.99"
  else
    fit_status="FAILED: an error, or a model with R^2 < 0.99 (see the output below)"
  fi
fi
{
  echo ""
  echo "## FinDEP performance models (findep_fit_gpu)"
  echo ""
  echo "- status: $fit_status"
  echo "- command: $build/examples/schedule/findep_fit_gpu --out $build/findep_gpu_models.tsv --samples $build/findep_gpu_samples.tsv"
  echo ""
  echo '```'
  cat "$build/findep_fit_gpu.txt" 2>/dev/null || echo "(no output)"
  echo '```'
  if [[ -f "$build/findep_gpu_models.tsv" ]]; then
    echo ""
    echo "Model file:"
    echo ""
    echo '```'
    cat "$build/findep_gpu_models.tsv"
    echo '```'
  fi
} >> "$out"
echo "appended the findep_fit_gpu table to $out"

# s-TS on the GPU (include/moe/kernels/shuffle.cuh, docs/speculative.md "GPU predictor and shuffle
# plan"): predictor lookup + shuffle planning tokens/s against the host predictor of the same run,
# and pack / unpack GB/s against a device copy.
rm -f "$build/bench_cuda_shuffle.json"
if cmake --build "$build" -j "$jobs" --target bench_cuda_shuffle; then
  "$build/benchmarks/cuda/bench_cuda_shuffle" --benchmark_filter="$filter" --benchmark_min_time="$min_time" \
    --benchmark_out="$build/bench_cuda_shuffle.json" --benchmark_out_format=json | tee "$build/bench_cuda_shuffle.txt" ||
    echo "gpu_bench.sh: bench_cuda_shuffle failed; the table keeps what it wrote" >&2
else
  echo "gpu_bench.sh: bench_cuda_shuffle did not build (Google Benchmark missing?)" >&2
fi
python3 - "$build/bench_cuda_shuffle.json" "$out" <<'PY'
import json, sys
path, out = sys.argv[1:3]
try:
    data = json.load(open(path))
except (OSError, ValueError) as exc:
    data = {"benchmarks": []}
    print("no shuffle benchmark results:", exc)
cols = ["tokens/s", "of_host", "GB/s", "of_copy"]
def fmt(v):
    if v is None: return ""
    if isinstance(v, float):
        if v >= 1e6: return f"{v:.3g}"
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return str(v)
lines = ["", "## s-TS predictor lookup, shuffle plan, pack / unpack (bench_cuda_shuffle)", "",
         "| benchmark | time (us) | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
for b in data.get("benchmarks", []):
    if b.get("run_type") == "aggregate": continue
    lines.append(f"| {b['name'].replace('/manual_time', '')} | {fmt(b.get('real_time'))} | "
                 + " | ".join(fmt(b.get(c)) for c in cols) + " |")
open(out, "a").write("\n".join(lines) + "\n")
print("appended the shuffle table to", out)
PY
