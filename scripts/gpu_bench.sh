#!/usr/bin/env bash
# Builds the CUDA tests and benchmarks for Hopper (sm_90a), runs the `cuda` tests and the GPU
# benchmarks, and writes a dated results table to docs/cuda-results-<UTC date>.md. The work is split
# into stages so that each fits one call of the device tool (10 minutes); docs/gpu-session.md gives
# the exact sequence of calls.
#
#   scripts/gpu_bench.sh [STAGE...]     stages run in the order given; no stage = all
#
#   configure  unpack .gpu-deps/*.deb into <build>/deps, cmake configure (NCCL from the torch wheel
#              when CMake finds none), build CHECK_TARGETS (default test_cuda_instantiate) and run
#              them; needs no GPU (exit 77 / "no CUDA device" notes are expected without one)
#   build      configure + build every CUDA test, benchmark and example target (-j JOBS)
#   test       ctest -L cuda                                                      (GPU)
#   bench      bench-moe + bench-torch + bench-shuffle                            (GPU)
#   bench-moe / bench-torch / bench-shuffle: one of the three alone             (GPU)
#   fit        examples/schedule/findep_fit_gpu (FinDEP performance models)       (GPU)
#   report     docs/cuda-results-<date>.md from whatever <results> holds; no GPU needed
#   all        build test bench fit report (the old one-go behaviour, for machines without limits)
#
# A GPU stage that finds its programs missing (a fresh machine) builds them first. Every stage ends
# with `report`, and when $OUT is set copies the results markdown, gpu-results.tar.gz (the whole
# results folder: logs, JSON, TSV, status) and this call's log (gpu_bench.log) into $OUT.
#
# Environment:
#   BUILD_DIR       build folder (default <repo>/build-gpu, git-ignored)
#   RESULTS_DIR     results folder (default <build>/results): JSON, logs and status of every stage
#   GPU_DEPS_DIR    folder of .deb files to unpack (default <repo>/.gpu-deps, see scripts/gpu_deps.sh)
#   JOBS            build jobs (default nproc)
#   BENCH_FILTER    Google Benchmark regex (default all); BENCH_MIN_TIME seconds each (default 0.2)
#   BENCH_PART      write bench_*.BENCH_PART.json beside the earlier JSON instead of replacing it
#                   (finishing a cut-off run with BENCH_FILTER; the report merges the parts)
#   BENCH_GEMM      grouped-GEMM kernel of bench_cuda_moe's Layer benchmarks: automatic (default),
#                   portable or hopper (e.g. portable if the Hopper kernel fails its test)
#   SKIP_TORCH      set: no PyTorch baselines
#   STAGE_BUDGET    seconds this call may take before its steps are cut off (default 540, the device
#                   tool kills a call at 600); each step runs under `timeout` with what is left
#   NCCL_ROOT       NCCL prefix to use; NCCL_FROM_PYTHON=1 uses the nvidia-nccl wheel of python3
#                   even when CMake finds a system NCCL
#   CHECK_TARGETS   targets the configure stage builds and runs (default test_cuda_instantiate)
#   CMAKE_EXTRA_ARGS  extra configure arguments, split at spaces (e.g. -DCMAKE_IGNORE_PREFIX_PATH=/usr)
#   GIT_COMMIT      commit recorded in the results when the tree has no .git (the device's copy)
# Needs CMake >= 3.24, nvcc, g++; Catch2 v2 and Google Benchmark from the system or from .gpu-deps;
# PyTorch is optional (eager loop-over-experts and torch._grouped_mm baselines on the same shapes).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
results=${RESULTS_DIR:-$build/results}
deps_src=${GPU_DEPS_DIR:-$root/.gpu-deps}
jobs=${JOBS:-$(nproc)}
filter=${BENCH_FILTER:-.}
min_time=${BENCH_MIN_TIME:-0.2}
budget=${STAGE_BUDGET:-540}
python=${PYTHON:-python3}

cuda_tests=(test_cuda_instantiate test_cuda_kernels test_cuda_layer test_findep_cuda test_cuda_shuffle)
cuda_benches=(bench_cuda_moe bench_cuda_shuffle)
cuda_examples=(findep_fit_gpu)

# ---------------------------------------------------------------------------------------------
# Arguments, log
# ---------------------------------------------------------------------------------------------
stages=("$@")
((${#stages[@]})) || stages=(all)
expanded=()
for s in "${stages[@]}"; do
  case $s in
    all) expanded+=(build test bench-moe bench-torch bench-shuffle fit report) ;;
    bench) expanded+=(bench-moe bench-torch bench-shuffle) ;;
    configure | build | test | bench-moe | bench-torch | bench-shuffle | fit | report) expanded+=("$s") ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bench.sh: unknown stage '$s' (configure build test bench bench-moe bench-torch bench-shuffle fit report all)" >&2; exit 2 ;;
  esac
done

mkdir -p "$results/status"
call_log="$results/log-$(date -u +%Y%m%dT%H%M%SZ)-$(IFS=-; echo "${stages[*]}").log"
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  exec > >(tee -a "$call_log" "$OUT/gpu_bench.log") 2>&1
else
  exec > >(tee -a "$call_log") 2>&1
fi
tee_pid=$!

# cmake / ninja from pip live next to python3 (the torch venv) and may not be on PATH; nvcc may sit
# only in /usr/local/cuda/bin.
venv_bin=$(dirname "$(command -v "$python" 2>/dev/null || echo /nonexistent/python3)")
for tool in cmake ninja; do
  if ! command -v "$tool" >/dev/null && [[ -x $venv_bin/$tool ]]; then PATH=$PATH:$venv_bin; fi
done
if [[ -z ${CUDACXX:-} ]] && ! command -v nvcc >/dev/null; then
  for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    if [[ -x $c ]]; then export CUDACXX=$c; break; fi
  done
fi

log() { echo "[gpu_bench $(date -u +%H:%M:%S) +${SECONDS}s] $*"; }
status() { echo "$2" >"$results/status/$1.txt"; log "$1: $2"; }

# bounded SECONDS CMD...: runs CMD under `timeout` with at most SECONDS, and never past the call's
# budget minus a reserve for the report and the copy to $OUT. Returns CMD's status (124: cut off).
bounded() {
  local want=$1 left
  shift
  left=$((budget - SECONDS - 25))
  ((left < want)) && want=$left
  if ((want < 5)); then
    log "no time left in this call's budget ($budget s) for: $*"
    return 124
  fi
  timeout --kill-after=10 "$want" "$@"
}

# ---------------------------------------------------------------------------------------------
# $OUT: the results markdown, the results folder as one tarball, this call's log (3 files)
# ---------------------------------------------------------------------------------------------
# The date in the name is the day of the measurement (day.txt, written by every GPU stage).
results_md_name() { echo "cuda-results-$(cat "$results/day.txt" 2>/dev/null || date -u +%Y-%m-%d).md"; }
# do_report [DEST]: the markdown into the results folder, and also to DEST (the `report` stage: docs/).
do_report() {
  local md
  md=$results/$(results_md_name)
  "$python" "$root/scripts/gpu_report.py" "$results" "$md" || { log "report: gpu_report.py failed"; return 1; }
  if [[ -n "${1:-}" ]]; then cp "$md" "$1/" && log "wrote $1/$(basename "$md")"; fi
}
export_out() {
  [[ -n "${OUT:-}" ]] || return 0
  local md
  md=$results/$(results_md_name)
  [[ -f "$md" ]] && cp "$md" "$OUT/"
  tar -czf "$OUT/gpu-results.tar.gz" -C "$(dirname "$results")" "$(basename "$results")" ||
    log "could not write $OUT/gpu-results.tar.gz"
}
finish() {
  local rc=$?
  trap - EXIT
  do_report >/dev/null || true
  export_out || true
  log "done (exit $rc); results in $results${OUT:+, copied to $OUT}"
  # Let tee write the last lines into the logs before the device tool collects $OUT.
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null || true
  exit "$rc"
}
trap finish EXIT

# ---------------------------------------------------------------------------------------------
# GPU, dependencies, configure
# ---------------------------------------------------------------------------------------------
need_gpu() {
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_bench.sh: no GPU (nvidia-smi failed); stage $1 needs one" >&2
    exit 1
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1 >"$results/device.txt"
  date -u +%Y-%m-%d >"$results/day.txt"
  if [[ -n "${GIT_COMMIT:-}" ]]; then
    echo "$GIT_COMMIT" >"$results/commit.txt"
  else
    git -C "$root" describe --always --dirty >"$results/commit.txt" 2>/dev/null || echo unknown >"$results/commit.txt"
  fi
}

cache_get() { sed -n "s/^$1:[A-Z_]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -1; }

# The Debian packages of .gpu-deps (scripts/gpu_deps.sh) unpacked into <build>/deps, never into /.
# Their CMake config files locate themselves (_IMPORT_PREFIX / PACKAGE_PREFIX_DIR are computed from
# the file's own folder), so CMAKE_PREFIX_PATH=<build>/deps/usr is all CMake needs.
unpack_deps() {
  local deps=$build/deps debs f member flag want
  shopt -s nullglob
  debs=("$deps_src"/*.deb)
  shopt -u nullglob
  if ((${#debs[@]} == 0)); then
    log "no .deb files in $deps_src: Catch2 and Google Benchmark must come from the system"
    return 0
  fi
  want=$(cd "$deps_src" && cksum -- *.deb)
  if [[ -f $deps/.moe-gpu-deps && "$(cat "$deps/.moe-gpu-deps")" == "$want" ]]; then
    log "deps: ${#debs[@]} packages already unpacked in $deps"
    return 0
  fi
  if [[ -e $deps ]]; then
    if [[ ! -f $deps/.moe-gpu-deps ]]; then
      echo "gpu_bench.sh: $deps exists and was not made by this script; move it away" >&2
      exit 1
    fi
    rm -rf -- "$deps"
  fi
  mkdir -p "$deps"
  for f in "${debs[@]}"; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$deps"
    else  # a .deb is an ar archive holding data.tar.{xz,zst,gz}
      member=$(ar t "$f" | grep '^data\.tar')
      case $member in *.xz) flag=-J ;; *.zst) flag=--zstd ;; *.gz) flag=-z ;; *) flag= ;; esac
      ar p "$f" "$member" | tar -x $flag -C "$deps"
    fi
    log "deps: unpacked $(basename "$f") into $deps"
  done
  echo "$want" >"$deps/.moe-gpu-deps"
}

# NCCL of the python3 that holds PyTorch: the wheel nvidia-nccl-cu13 installs
# site-packages/nvidia/nccl/{include/nccl.h,lib/libnccl.so.2}. Prints that nvidia/nccl folder.
nccl_from_python() {
  "$python" - 2>/dev/null <<'PY'
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(1)
for base in list(getattr(nvidia, "__path__", [])):
    for lib in sorted(glob.glob(os.path.join(base, "*", "lib", "libnccl.so*"))):
        print(os.path.dirname(os.path.dirname(lib)))
        sys.exit(0)
sys.exit(1)
PY
}
# Sets nccl_args for the wheel's NCCL; a wheel without nccl.h gets the header gpu_deps.sh copied.
wheel_nccl_args() {
  local dir
  if ! dir=$(nccl_from_python); then
    log "NCCL: python3 ($python) has no nvidia NCCL wheel either; NCCL code is not built"
    return 1
  fi
  log "NCCL: using the python wheel's NCCL in $dir"
  nccl_args=(-UNCCL_LIBRARY "-DNCCL_ROOT=$dir")
  if [[ -f $dir/include/nccl.h ]]; then
    nccl_args+=(-UNCCL_INCLUDE_DIR)
  elif [[ -f $deps_src/nccl-include/nccl.h ]]; then
    log "NCCL: the wheel has no nccl.h; using $deps_src/nccl-include/nccl.h (from the dev machine's toolkit)"
    nccl_args+=("-DNCCL_INCLUDE_DIR=$deps_src/nccl-include")
  fi
}

run_cmake() {
  local args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=OFF
    "-DCMAKE_CUDA_FLAGS=-gencode=arch=compute_90a,code=sm_90a"
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
  local extra=()
  if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then args+=(-G Ninja); fi
  if [[ -d $build/deps/usr ]]; then args+=("-DCMAKE_PREFIX_PATH=$build/deps/usr"); fi
  if [[ -n ${CMAKE_EXTRA_ARGS:-} ]]; then read -ra extra <<<"$CMAKE_EXTRA_ARGS"; fi
  args+=("${extra[@]}" "$@")
  log "cmake ${args[*]}"
  bounded 300 cmake "${args[@]}" 2>&1 | tee -a "$results/configure.log"
}

# Hopper only: sm_90a (wgmma/TMA capable). CMAKE_CUDA_ARCHITECTURES=OFF so that CMake adds no
# architecture flags of its own. The CUDA20 options teach CMake < 3.26 nvcc's -std=c++20.
do_configure() {
  local nccl_args=() tests=ON
  unpack_deps
  log "tools: cmake=$(command -v cmake || echo MISSING) ninja=$(command -v ninja || echo none) nvcc=${CUDACXX:-$(command -v nvcc || echo MISSING)} c++=$(command -v c++ || command -v g++ || echo MISSING) python=$(command -v "$python" || echo MISSING)"
  : >"$results/configure.log"
  if [[ -n ${NCCL_ROOT:-} ]]; then
    nccl_args=(-UNCCL_LIBRARY -UNCCL_INCLUDE_DIR "-DNCCL_ROOT=$NCCL_ROOT")
  elif [[ ${NCCL_FROM_PYTHON:-} == 1 ]]; then
    wheel_nccl_args || true
  fi
  if ! run_cmake -DMOE_BUILD_TESTS=ON "${nccl_args[@]}"; then
    # Catch2 is REQUIRED by the test suite: without it the benchmarks and examples still build.
    log "configure failed; once more without the test suite (Catch2 missing?)"
    tests=OFF
    if ! run_cmake -DMOE_BUILD_TESTS=OFF "${nccl_args[@]}"; then
      status configure "FAILED (see configure.log)"
      return 1
    fi
  fi
  local cuda
  cuda=$(sed -n 's/.*moe: CUDA=\([A-Z]*\).*/\1/p' "$results/configure.log" | tail -1)
  if ((${#nccl_args[@]} == 0)) && [[ $cuda == ON && ( -z "$(cache_get NCCL_LIBRARY)" || "$(cache_get NCCL_LIBRARY)" == *NOTFOUND* ) ]]; then
    if wheel_nccl_args; then
      run_cmake "-DMOE_BUILD_TESTS=$tests" "${nccl_args[@]}" || { status configure "FAILED (see configure.log)"; return 1; }
    fi
  fi
  local line
  line=$(grep 'moe: CUDA=' "$results/configure.log" | tail -1 | sed 's/^-- //')
  status configure "ok: $line; tests=$tests; Catch2_DIR=$(cache_get Catch2_DIR); benchmark_DIR=$(cache_get benchmark_DIR); NCCL_LIBRARY=$(cache_get NCCL_LIBRARY)"
  cmake --build "$build" --target help >"$build/.moe-targets" 2>/dev/null || true
}

have_target() { grep -Eq "(^|[ .])$1(:| |\$)" "$build/.moe-targets" 2>/dev/null; }
target_path() {
  case $1 in
    test_*) echo "$build/tests/cuda/$1" ;;
    bench_*) echo "$build/benchmarks/cuda/$1" ;;
    *) echo "$build/examples/schedule/$1" ;;
  esac
}

# build_targets T...: configures a fresh build folder first; builds the targets that exist (a
# missing Catch2 / Google Benchmark removes some), keeps going past a failing one, and records each.
# REBUILD=0: programs that exist are used as they are (no cmake --build).
build_targets() {
  local want=() t keep=(-- -k) all_there=1
  if [[ ! -f $build/CMakeCache.txt || ! -f $build/.moe-targets ]]; then do_configure || return 1; fi
  for t in "$@"; do
    if have_target "$t"; then
      want+=("$t")
      [[ -x $(target_path "$t") ]] || all_there=0
    else
      status "build-$t" "not configured (Catch2, Google Benchmark or nvcc missing: see configure.log)"
    fi
  done
  ((${#want[@]})) || return 1
  if [[ ${REBUILD:-1} == 0 && $all_there == 1 ]]; then
    log "REBUILD=0: using the programs already built: ${want[*]}"
    return 0
  fi
  [[ $(cache_get CMAKE_GENERATOR) == Ninja* ]] && keep=(-- -k 0)
  # Remove the programs (a relink, not a recompile) so that a failed build cannot leave an old one.
  for t in "${want[@]}"; do rm -f -- "$(target_path "$t")"; done
  log "building ${want[*]} with -j $jobs"
  bounded 560 cmake --build "$build" -j "$jobs" --target "${want[@]}" "${keep[@]}" 2>&1 |
    tee -a "$results/build.log" || log "build: not every target built (see build.log)"
  local rc=0
  for t in "${want[@]}"; do
    if [[ -x $(target_path "$t") ]]; then
      status "build-$t" "ok"
    else
      status "build-$t" "FAILED or cut off (see build.log)"
      rc=1
    fi
  done
  return $rc
}

# Shared libraries outside the system folders at run time: libbenchmark.so.1debian from
# <build>/deps and NCCL's folder (the wheel's lib/ holds only libnccl.so.2). CMake's build RPATH
# names them too; LD_LIBRARY_PATH also covers ctest and programs run from elsewhere.
runtime_env() {
  [[ -z ${_moe_runtime_env:-} ]] || return 0
  _moe_runtime_env=1
  local dirs=() d lib
  for d in "$build/deps/usr/lib/x86_64-linux-gnu" "$build/deps/usr/lib"; do
    if compgen -G "$d/*.so*" >/dev/null; then dirs+=("$d"); fi
  done
  lib=$(cache_get NCCL_LIBRARY)
  if [[ -f $lib ]]; then dirs+=("$(dirname "$lib")"); fi
  if ((${#dirs[@]})); then
    LD_LIBRARY_PATH=$(IFS=:; echo "${dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
    log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  fi
}

# step_status NAME RC [what ok means]
step_status() {
  case $2 in
    0) status "$1" "${3:-ok}" ;;
    124 | 137) status "$1" "TIMED OUT (cut off by this call's budget or the step's limit)" ;;
    *) status "$1" "FAILED (exit $2)" ;;
  esac
}

# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------
stage_configure() {
  do_configure || return 1
  local t path rc
  runtime_env
  for t in ${CHECK_TARGETS-test_cuda_instantiate}; do
    build_targets "$t" || continue
    path=$(target_path "$t")
    log "check $t: shared libraries:"
    ldd "$path" | grep -E 'benchmark|nccl|cudart|not found' || true
    rc=0
    bounded 120 "$path" || rc=$?
    # Without a GPU: a test exits 77 (skipped), a benchmark prints a note and exits 0.
    status "check-$t" "built and ran, exit $rc"
  done
}

stage_build() {
  do_configure || return 1
  build_targets "${cuda_tests[@]}" "${cuda_benches[@]}" "${cuda_examples[@]}" || true
}

stage_test() {
  need_gpu test
  build_targets "${cuda_tests[@]}" || true
  runtime_env
  rm -f "$results/cuda-tests.log"
  local rc=0
  # Each cuda test has TIMEOUT 900 (MoeHelpers.cmake), which `ctest --timeout` does not override;
  # the call's budget cuts the whole run instead.
  bounded 560 ctest --test-dir "$build" -L cuda --output-on-failure 2>&1 |
    tee "$results/cuda-tests.log" || rc=$?
  if [[ $rc == 0 ]] && grep -q '(Skipped)' "$results/cuda-tests.log"; then
    status test "SKIPPED: $(grep -c '(Skipped)' "$results/cuda-tests.log") test(s) exited 77 (no usable GPU seen: driver, device)"
  else
    step_status test "$rc" "ok: $(grep 'tests passed' "$results/cuda-tests.log" | tail -1)"
  fi
}

run_bench() {  # NAME LIMIT
  local name=$1 rc=0
  need_gpu "$name"
  # BENCH_PART=x writes NAME.x.json beside an earlier NAME.json instead of replacing it (to finish
  # a run its budget cut off); the report merges the parts.
  local out=$results/$name.json step=$name
  if [[ -n "${BENCH_PART:-}" ]]; then out=$results/$name.$BENCH_PART.json step=$name.$BENCH_PART; fi
  rm -f "$out" "${out%.json}.txt"
  if ! build_targets "$name"; then
    status "$step" "not run: not built"
    return 0
  fi
  runtime_env
  local extra=()
  if [[ $name == bench_cuda_moe && -n "${BENCH_GEMM:-}" ]]; then extra+=("--gemm=$BENCH_GEMM"); fi
  bounded "$2" "$(target_path "$name")" --benchmark_filter="$filter" --benchmark_min_time="$min_time" \
    --benchmark_out="$out" --benchmark_out_format=json "${extra[@]}" 2>&1 | tee "${out%.json}.txt" || rc=$?
  if [[ $rc == 0 && ! -s $out ]]; then
    status "$step" "exit 0 but no JSON written (no CUDA device seen?)"
  else
    step_status "$step" "$rc"
  fi
}

# PyTorch baselines on the benchmark's shapes: eager loop over experts, and torch._grouped_mm.
stage_bench_torch() {
  need_gpu bench-torch
  local json=$results/torch_baselines.json rc=0
  rm -f "$json"
  if [[ -n "${SKIP_TORCH:-}" ]]; then
    status bench-torch "skipped (SKIP_TORCH)"
    return 0
  fi
  if ! "$python" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    status bench-torch "skipped: no PyTorch with CUDA in $python"
    return 0
  fi
  runtime_env
  PYTHONUNBUFFERED=1 bounded 300 "$python" - "$json" "$root/tests/data/olmoe-routing" 2>&1 <<'PY' | tee "$results/torch_baselines.txt" || rc=$?
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

# The grouped GEMMs under real expert loads, as bench_cuda_moe's GroupedGemmLoad: tokens * top_k
# rows split over the experts in proportion to one recorded layer's corpus counts (largest
# remainder, ties to the lower expert; the same arithmetic as the C++), or evenly ("uniform").
def split(weights, rows):
    total = 0.0
    for w in weights: total += w
    q = [rows * w / total for w in weights]
    n = [math.floor(v) for v in q]
    order = sorted(range(len(q)), key=lambda e: (-(q[e] - n[e]), e))
    for e in order[:rows - sum(n)]: n[e] += 1
    return n

def layer_counts(folder, domain, pos):
    per_layer = {}
    for line in open(f"{sys.argv[2]}/{folder}/{domain}/expert_counts.tsv"):
        f = line.split()
        if not f or f[0] == "layer": continue
        c = per_layer.setdefault(int(f[0]), {})
        c[int(f[1])] = c.get(int(f[1]), 0.0) + float(f[2])
    layer = list(per_layer)[pos]
    c = per_layer[layer]
    return [c.get(e, 0.0) for e in range(max(c) + 1)]

load_shapes = {  # name: hidden, expert_ffn, experts, top_k, cases (name, folder, domain, layer position)
    "OLMoE-1B-7B": (2048, 1024, 64, 8, [("uniform", None, None, 0), ("arxiv-L0", "olmoe-1b-7b", "arxiv", 0),
                                          ("c4-L15", "olmoe-1b-7b", "c4", 2)]),
    "Mixtral-8x7B": (4096, 14336, 8, 2, [("uniform", None, None, 0), ("github-L15", "mixtral-8x7b", "github", 2)]),
}
load_rows = []
for name, (h, f, E, k, cases) in load_shapes.items():
    g = torch.Generator(device=dev).manual_seed(2)
    w1 = (torch.rand(E, f, h, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1) / math.sqrt(h)
    w3 = (torch.rand(E, f, h, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1) / math.sqrt(h)
    w2 = (torch.rand(E, h, f, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1) / math.sqrt(f)
    for T in (128, 4096, 16384):
        for case, folder, domain, pos in cases:
            row = {"model": name, "load": case, "tokens": T}
            try:
                weights = [1.0] * E if folder is None else layer_counts(folder, domain, pos)
                n = split(weights, T * k)
                offs = torch.cumsum(torch.tensor(n, device=dev), 0).to(torch.int32)
                xs = torch.randn(T * k, h, device=dev, generator=g, dtype=torch.bfloat16)
                def gemms():
                    a = torch._grouped_mm(xs, w1.transpose(-2, -1), offs=offs)
                    b = torch._grouped_mm(xs, w3.transpose(-2, -1), offs=offs)
                    return torch._grouped_mm(F.silu(a) * b, w2.transpose(-2, -1), offs=offs)
                ms = timed(gemms)
                row["grouped_mm_gemms_ms"] = ms
                row["grouped_mm_tflops"] = 6.0 * T * k * h * f / (ms / 1e3) / 1e12
                row["max_over_mean"] = max(n) / (T * k / E)
            except Exception as exc:  # report, keep going
                row["grouped_mm_gemms_ms"] = None; row["grouped_mm_error"] = str(exc)[:200]
            load_rows.append(row)
            print(row, flush=True)
    del w1, w2, w3
    torch.cuda.empty_cache()
json.dump({"torch": torch.__version__, "rows": rows, "load_rows": load_rows}, open(sys.argv[1], "w"), indent=1)
PY
  step_status bench-torch "$rc"
}

# FinDEP performance models on this GPU (examples/schedule/findep_fit_gpu, docs/findep.md "GPU
# microbenchmarks"): measures, fits, writes the model file; its table goes into the results file.
# A failed run or an R^2 below 0.99 is reported in the table and does not stop the script.
stage_fit() {
  need_gpu fit
  rm -f "$results/findep_gpu_models.tsv" "$results/findep_gpu_samples.tsv" "$results/findep_fit_gpu.txt"
  if ! build_targets findep_fit_gpu; then
    echo "did not build" >"$results/findep_fit_status.txt"
    status fit "not run: not built"
    return 0
  fi
  runtime_env
  local rc=0 msg
  bounded 480 "$(target_path findep_fit_gpu)" --out "$results/findep_gpu_models.tsv" \
    --samples "$results/findep_gpu_samples.tsv" 2>&1 | tee "$results/findep_fit_gpu.txt" || rc=$?
  case $rc in
    0) msg="all six models reach R^2 >= 0.99" ;;
    124 | 137) msg="TIMED OUT: cut off by this call's budget (STAGE_BUDGET=$budget s)" ;;
    *) msg="FAILED: an error, or a model with R^2 < 0.99 (see the output below)" ;;
  esac
  echo "$msg" >"$results/findep_fit_status.txt"
  status fit "$msg"
}

# ---------------------------------------------------------------------------------------------
log "stages: ${expanded[*]}; build folder $build; results $results; budget $budget s"
for s in "${expanded[@]}"; do
  log "=== stage $s"
  case $s in
    configure) stage_configure || exit 1 ;;
    build) stage_build || exit 1 ;;
    test) stage_test ;;
    bench-moe) run_bench bench_cuda_moe 360 ;;
    bench-torch) stage_bench_torch ;;
    bench-shuffle) run_bench bench_cuda_shuffle 240 ;;
    fit) stage_fit ;;
    report) do_report "$root/docs" ;;
  esac
  # After each stage too, so that a call killed from outside still returns the stages before.
  if [[ -n "${OUT:-}" ]]; then do_report >/dev/null || true; export_out || true; fi
done
