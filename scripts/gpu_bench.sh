#!/usr/bin/env bash
# The GPU tests and benchmarks of moe-compose in one run that ends within 9 minutes on a machine with
# one Hopper GPU (H100 or H200, 16 cores): configure, build exactly the programs it runs, test,
# measure, fit. docs/gpu.md explains the requirements and how to read the results.
#
#   scripts/gpu_bench.sh                 the whole run (without a GPU: a rehearsal, see below)
#   scripts/gpu_bench.sh --dry-run       configure, then list the steps, their budgets and the build
#                                        targets; builds and runs nothing
#   scripts/gpu_bench.sh --report DIR    write DIR/gpu-results.md again from a results folder
#
# Steps, the most valuable first. Each runs under `timeout` with the smaller of its cap and the time
# the run has left (less a reserve for the results file); a step that would get less than its
# minimum is skipped and says so.
#
#   step         cap  min  what
#   configure     90   15  CMake with Ninja, Release, sm_90a; Catch2 / Google Benchmark from the
#                          system or from .gpu-deps (scripts/gpu_deps.sh); NCCL from the PyTorch wheel
#   build        330   30  the `cuda` tests, the three bench_cuda_* programs and findep_fit_gpu,
#                          on every core, in one build call
#   test         150   20  ctest -L cuda: every CUDA kernel and the layers against the host reference
#   split         60   20  bench_cuda_batch_split: the per-batch replica split kernel (DeepSeek-V3, EP32)
#   torch-split   45   15  the same split from PyTorch (moe_compose.device on torch CUDA tensors, through
#                          libmoe_compose_cuda.so): checked, captured in a CUDA graph, timed
#   kernels      150   30  bench_cuda_moe: grouped GEMM (portable and Hopper kernels), permute, packing
#                          and combine, with the same run's baselines (device copy bandwidth, dense
#                          cuBLAS GEMM, a loop of per-expert cuBLAS GEMMs)
#   torch-gemm    90   30  torch._grouped_mm on the same grouped-GEMM shapes and real expert loads
#   layer        120   30  bench_cuda_moe: the whole single-GPU layer (also as a CUDA graph) and the
#                          grouped GEMM under real expert loads
#   torch-layer  100   30  the same layer in PyTorch: an eager loop over experts, and torch._grouped_mm
#   shuffle       60   15  bench_cuda_shuffle: s-TS predictor lookup, shuffle plan, row pack / unpack
#   fit          200   45  findep_fit_gpu: the FinDEP performance models of this GPU
#
# Output (the results folder: $OUT when set, else <build>/results), rewritten after every step so
# that a run stopped at any moment keeps what it finished:
#   gpu-results.md           the results file: the run, every step with budget / time used / status,
#                            then the tables (scripts/gpu_report.py)
#   bench_cuda_moe.json      raw Google Benchmark JSON of `kernels` (.layer.json: of `layer`)
#   bench_cuda_shuffle.json  raw JSON of `shuffle`
#   bench_cuda_batch_split.json  raw JSON of `split`
#   torch_baselines.json     raw PyTorch timings (torch-gemm, torch-layer)
#   torch_split.json         the rows of torch-split
#   findep_gpu_models.tsv    the fitted models (findep_gpu_samples.tsv: the measured points)
#   steps.tsv, run.txt, *.log   step table, run facts, the output of every step (run.log: all of it)
#
# Without a GPU (`nvidia-smi -L` lists none) the same steps run as a rehearsal: the build has no time
# limit and is charged at most its budget (a 2-core machine builds slower than a 16-core one), the
# tests report skipped (exit 77), the benchmarks print their no-device note, and the results file
# says that nothing was measured. A rehearsal exits 0 when every step did what it does without a GPU.
#
# Exit status: 0 every step ran (or, in a rehearsal, behaved as expected without a GPU); 1 a step
# failed (build error, failed test, crashed benchmark); 2 nothing failed but a step was cut off or
# skipped for lack of time.
#
# Environment:
#   OUT            results folder (default <build>/results)
#   BUILD_DIR      build folder (default <repo>/build-gpu)
#   BUDGET         seconds the whole run may take (default 540)
#   JOBS           build jobs (default: every core)
#   GPU_DEPS_DIR   folder of Debian packages to unpack into <build>/deps (default <repo>/.gpu-deps)
#   NCCL_ROOT      NCCL prefix to use instead of the PyTorch wheel's (or CMake's own search)
#   PYTHON         the python3 with PyTorch (default python3)
#   SKIP_TORCH     set: no PyTorch baselines
#   BENCH_MIN_TIME Google Benchmark seconds per benchmark (default 0.1)
#   BENCH_GEMM     grouped-GEMM kernel of the Layer benchmarks: automatic (default), portable, hopper
#   CTEST_JOBS     tests run side by side on the GPU (default 1)
#   CMAKE_EXTRA_ARGS  more configure arguments, split at spaces
#   CMAKE_GENERATOR   generator of a new build folder (default Ninja when installed)
#   GIT_COMMIT     commit to record when the tree has no .git
#   MOE_NO_CCACHE  set: no ccache even where it is installed
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

if [[ ${1:-} == --report ]]; then
  [[ -n ${2:-} ]] || { echo "usage: scripts/gpu_bench.sh --report RESULTS_DIR" >&2; exit 2; }
  exec "$python" "$root/scripts/gpu_report.py" "$2" "$2/gpu-results.md"
fi
mode=run
case ${1:-} in
  "") ;;
  --dry-run) mode=dry-run ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_bench.sh: unknown argument '$1' (--dry-run, --report DIR, --help)" >&2; exit 2 ;;
esac

build=$(realpath -m -- "${BUILD_DIR:-$root/build-gpu}")
results=$(realpath -m -- "${OUT:-$build/results}")
deps_src=${GPU_DEPS_DIR:-$root/.gpu-deps}
jobs=${JOBS:-$(nproc)}
budget=${BUDGET:-540}
min_time=${BENCH_MIN_TIME:-0.1}
reserve=15   # seconds kept for the results file at the end

steps=(configure build test split torch-split kernels torch-gemm layer torch-layer shuffle fit)
declare -A cap=([configure]=90 [build]=330 [test]=150 [kernels]=150 [torch-gemm]=90 [layer]=120
                [torch-layer]=100 [shuffle]=60 [split]=60 [torch-split]=45 [fit]=200)
declare -A need=([configure]=15 [build]=30 [test]=20 [kernels]=30 [torch-gemm]=30 [layer]=30
                 [torch-layer]=30 [shuffle]=15 [split]=20 [torch-split]=15 [fit]=45)
declare -A what=([configure]="CMake configure (Release, sm_90a; Ninja when installed)"
                 [build]="build the programs the steps below run (run.txt: targets), all cores"
                 [test]="ctest -L cuda (kernels and layers against the host reference)"
                 [kernels]="bench_cuda_moe: grouped GEMM, permute/pack/combine + copy, dense and loop baselines"
                 [torch-gemm]="torch._grouped_mm on the grouped-GEMM shapes and real loads"
                 [layer]="bench_cuda_moe: single-GPU layer, layer as CUDA graph, GEMM under real loads"
                 [torch-layer]="PyTorch layer: eager loop over experts, torch._grouped_mm"
                 [shuffle]="bench_cuda_shuffle: s-TS lookup, shuffle plan, pack/unpack"
                 [split]="bench_cuda_batch_split: per-batch replica split kernel, DeepSeek-V3 EP32"
                 [torch-split]="the split from PyTorch (moe_compose.device, libmoe_compose_cuda.so)"
                 [fit]="findep_fit_gpu: FinDEP performance models")
kernel_filter='^(Copy|DenseGemm|CublasExpertLoop|GroupedGemmPortable|GroupedGemm|Permute|PackRecords|Combine)/'
layer_filter='^(Layer|LayerGraph|GroupedGemmLoad)/'
declare -A budget_of used_of status_of
for s in "${steps[@]}"; do status_of[$s]="not reached"; done

mkdir -p "$results"
# Only the files this script writes; $OUT may be a folder the caller keeps other things in.
rm -f "$results"/{gpu-results.md,steps.tsv,run.txt,run.log,configure.log,build.log,cuda-tests.log} \
      "$results"/bench_cuda_moe{,.layer}.{json,txt,log} "$results"/bench_cuda_shuffle.{json,txt,log} \
      "$results"/bench_cuda_batch_split.{json,txt,log} \
      "$results"/torch_baselines.json "$results"/torch-{gemm,layer}.log \
      "$results"/torch_split.json "$results"/torch-split.log \
      "$results"/findep_{gpu_models,gpu_samples}.tsv "$results"/findep_fit_{gpu.txt,status.txt}
exec > >(tee -a "$results/run.log") 2>&1
tee_pid=$!

log() { echo "[gpu_bench +${SECONDS}s] $*"; }

# cmake and ninja installed with pip live beside python3 and may not be on PATH; nvcc may sit only
# in /usr/local/cuda/bin.
venv_bin=$(dirname "$(command -v "$python" 2>/dev/null || echo /nonexistent/python3)")
for tool in cmake ninja; do
  if ! command -v "$tool" >/dev/null && [[ -x $venv_bin/$tool ]]; then PATH=$PATH:$venv_bin; fi
done
if [[ -z ${CUDACXX:-} ]] && ! command -v nvcc >/dev/null; then
  for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    if [[ -x $c ]]; then export CUDACXX=$c; break; fi
  done
fi

# ---------------------------------------------------------------------------------------------
# The GPU, the run's facts
# ---------------------------------------------------------------------------------------------
gpu=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  gpu=${gpu:-$(nvidia-smi -L | head -1)}
fi
rehearsal=0
[[ -z $gpu ]] && rehearsal=1
commit=${GIT_COMMIT:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo "unknown (no .git)")}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  case $mode/$rehearsal in
    dry-run/*) echo "mode: dry run (configure and list only; nothing built or measured)" ;;
    run/1) echo "mode: rehearsal without a GPU (nothing measured)" ;;
    *) echo "mode: GPU run" ;;
  esac
  echo "device: ${gpu:-none (nvidia-smi lists no GPU)}"
  echo "commit: $commit"
  echo "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null), build jobs $jobs"
  echo "budget: $budget s (reserve $reserve s for the results file)"
  echo "nvcc: $("${CUDACXX:-nvcc}" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' || true)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1 | awk '{print $3}')"
} >"$results/run.txt"
log "$(tr '\n' ';' <"$results/run.txt")"
if [[ -n $gpu && $gpu != *", 9.0,"* ]]; then
  log "WARNING: the build targets sm_90a (Hopper); this GPU ($gpu) cannot run it"
fi

# ---------------------------------------------------------------------------------------------
# Steps, budgets, the step table
# ---------------------------------------------------------------------------------------------
charged=0    # seconds a rehearsal's build ran past its budget, not charged to the run
elapsed() { echo $((SECONDS - charged)); }

write_steps() {
  local s
  {
    printf 'step\twhat\tcap_s\tbudget_s\tused_s\tstatus\n'
    for s in "${steps[@]}"; do
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "${what[$s]}" "${cap[$s]}" "${budget_of[$s]:-}" "${used_of[$s]:-}" "${status_of[$s]}"
    done
  } >"$results/steps.tsv"
}
report() {
  write_steps
  "$python" "$root/scripts/gpu_report.py" "$results" "$results/gpu-results.md" >/dev/null ||
    log "gpu_report.py failed; steps.tsv and the raw files are still there"
}
finish() {
  local rc=$?
  trap - EXIT
  report || true
  log "done (exit $rc) after ${SECONDS}s; results in $results/gpu-results.md"
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null || true
  exit "$rc"
}
trap finish EXIT

failed=0 cut=0
# run_step NAME: gives the step its budget, runs step_NAME (which sets `msg` and returns 0 ok,
# 1 failed, 124 cut off), records the outcome.
run_step() {
  local s=$1 left b t0 rc=0
  left=$((budget - reserve - $(elapsed)))
  b=${cap[$s]}
  ((left < b)) && b=$left
  budget_of[$s]=$b
  if ((b < need[$s])); then
    status_of[$s]="SKIPPED: ${left} s left, needs at least ${need[$s]} s"
    cut=1
    log "$s: ${status_of[$s]}"
    report
    return 0
  fi
  log "=== $s (budget $b s): ${what[$s]}"
  status_of[$s]="running"
  write_steps
  t0=$SECONDS
  msg=""
  "step_${s//-/_}" "$b" || rc=$?
  used_of[$s]=$((SECONDS - t0))
  case $rc in
    0) status_of[$s]=${msg:-ok} ;;
    124 | 137) status_of[$s]="TIMED OUT after ${used_of[$s]} s${msg:+: $msg}"; cut=1 ;;
    *) status_of[$s]="FAILED${msg:+: $msg}"; failed=1 ;;
  esac
  log "$s: ${status_of[$s]} (${used_of[$s]} s)"
  report
}

# limited SECONDS LOG CMD...: CMD under `timeout` (its process group killed 5 s after the
# deadline), output shown and appended to LOG; returns CMD's status (124 or 137: cut off).
limited() {
  local secs=$1 logf=$2 rc
  shift 2
  set +e
  timeout --kill-after=5 "$secs" "$@" 2>&1 | tee -a "$logf"
  rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}

cache_get() { sed -n "s/^$1:[A-Z_]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -1; }

# ---------------------------------------------------------------------------------------------
# configure
# ---------------------------------------------------------------------------------------------
# The Debian packages of .gpu-deps (scripts/gpu_deps.sh) unpacked into <build>/deps, never into /.
# Their CMake config files compute their prefix from their own folder, so CMAKE_PREFIX_PATH=
# <build>/deps/usr is all CMake needs.
unpack_deps() {
  local deps=$build/deps debs f member flag want
  shopt -s nullglob
  debs=("$deps_src"/*.deb)
  shopt -u nullglob
  ((${#debs[@]})) || return 0
  want=$(cd "$deps_src" && cksum -- *.deb)
  if [[ -f $deps/.moe-gpu-deps && "$(cat "$deps/.moe-gpu-deps")" == "$want" ]]; then return 0; fi
  if [[ -e $deps ]]; then
    [[ -f $deps/.moe-gpu-deps ]] || { msg="$deps exists and was not made by this script; move it away"; return 1; }
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
    log "deps: unpacked $(basename "$f")"
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

step_configure() {
  local b=$1 args=() nccl extra=() dir
  unpack_deps || return 1
  args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOE_BUILD_TESTS=ON -DMOE_BUILD_BENCHMARKS=ON
        -DMOE_BUILD_EXAMPLES=ON -DMOE_EMULATOR=OFF "-DMOE_AREAS=cuda;schedule;extending")
  # The test programs in full on a GPU; in a rehearsal their device code only, as in the test stage of
  # CI (tests/cuda/CMakeLists.txt: the program then exits 77, so the test step reads the same).
  if ((rehearsal)); then args+=(-DMOE_CUDA_TESTS=device-only); else args+=(-DMOE_CUDA_TESTS=full); fi
  # Ninja for a new build folder, unless CMAKE_GENERATOR (read by CMake itself) names another.
  if [[ ! -f $build/CMakeCache.txt && -z ${CMAKE_GENERATOR:-} ]] && command -v ninja >/dev/null; then args+=(-G Ninja); fi
  [[ -d $build/deps/usr ]] && args+=("-DCMAKE_PREFIX_PATH=$build/deps/usr")
  # NCCL: NCCL_ROOT, else the PyTorch wheel's, else whatever CMake finds.
  if [[ -n ${NCCL_ROOT:-} ]]; then
    args+=(-UNCCL_LIBRARY -UNCCL_INCLUDE_DIR "-DNCCL_ROOT=$NCCL_ROOT")
  elif dir=$(nccl_from_python); then
    log "NCCL: the PyTorch wheel's, in $dir"
    args+=(-UNCCL_LIBRARY "-DNCCL_ROOT=$dir")
    if [[ -f $dir/include/nccl.h ]]; then
      args+=(-UNCCL_INCLUDE_DIR)
    elif [[ -f $deps_src/nccl-include/nccl.h ]]; then
      args+=("-DNCCL_INCLUDE_DIR=$deps_src/nccl-include")
    fi
  fi
  if command -v ccache >/dev/null && [[ -z ${MOE_NO_CCACHE:-} ]]; then
    export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  else
    args+=(-UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER)
  fi
  [[ -n ${CMAKE_EXTRA_ARGS:-} ]] && read -ra extra <<<"$CMAKE_EXTRA_ARGS"
  args+=("${extra[@]}")
  log "cmake ${args[*]}"
  local rc=0
  limited "$b" "$results/configure.log" cmake "${args[@]}" || rc=$?
  if ((rc)); then
    msg="cmake exit $rc (see configure.log)"
    return "$rc"
  fi
  # The targets: what `ctest -L cuda` runs (a cuda test's program has the test's name), the three
  # benchmark programs and the FinDEP fit.
  tests=$(ctest --test-dir "$build" -N -L cuda 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: *//p' | tr '\n' ' ')
  targets=($tests bench_cuda_moe bench_cuda_shuffle bench_cuda_batch_split moe_compose_cuda findep_fit_gpu)
  cmake --build "$build" --target help >"$build/.moe-targets" 2>/dev/null || true
  missing=()
  for t in "${targets[@]}"; do have_target "$t" || missing+=("$t"); done
  local line
  line=$(grep -o 'moe: CUDA=.*' "$results/configure.log" | tail -1)
  msg="ok: ${line#moe: }; ${#targets[@]} targets (run.txt)"
  ((${#missing[@]} == 0)) || msg+="; NOT CONFIGURED: ${missing[*]} (see the 'left out' line of configure.log)"
  msg+="; Catch2 $(cache_get Catch2_DIR), benchmark $(cache_get benchmark_DIR), NCCL $(cache_get NCCL_LIBRARY)"
  echo "targets: ${targets[*]}" >>"$results/run.txt"
  [[ $line == *CUDA=ON* ]] || { msg="nvcc or the CUDA toolkit not found: $line"; return 1; }
  ((${#missing[@]} == 0)) || return 1
}
have_target() { grep -Eq "(^|[ .])$1(:| |\$)" "$build/.moe-targets" 2>/dev/null; }
program() {
  case $1 in
    test_*) echo "$build/tests/cuda/$1" ;;
    bench_*) echo "$build/benchmarks/cuda/$1" ;;
    moe_compose_cuda) echo "$build/tests/cuda/libmoe_compose_cuda.so" ;;
    extending_*) echo "$build/examples/extending/$1" ;;
    *) echo "$build/tools/schedule/$1" ;;
  esac
}

# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------
step_build() {
  local b=$1 keep=(-- -k) want=() t built=() broken=() rc=0
  for t in "${targets[@]}"; do have_target "$t" && want+=("$t"); done
  ((${#want[@]})) || { msg="nothing to build"; return 1; }
  [[ $(cache_get CMAKE_GENERATOR) == Ninja* ]] && keep=(-- -k 0)
  # A program left from an earlier build must not pass for this one (removing it costs a relink).
  for t in "${want[@]}"; do rm -f -- "$(program "$t")"; done
  log "building ${#want[@]} targets with -j $jobs: ${want[*]}"
  if ((rehearsal)); then
    limited 7200 "$results/build.log" cmake --build "$build" -j "$jobs" --target "${want[@]}" "${keep[@]}" || rc=$?
  else
    limited "$b" "$results/build.log" cmake --build "$build" -j "$jobs" --target "${want[@]}" "${keep[@]}" || rc=$?
  fi
  for t in "${want[@]}"; do
    if [[ -x $(program "$t") ]]; then built+=("$t"); else broken+=("$t"); fi
  done
  msg="built ${#built[@]} of ${#want[@]}"
  ((${#broken[@]} == 0)) || msg+="; NOT BUILT: ${broken[*]} (see build.log)"
  if ((rehearsal && SECONDS - build_t0 > b)); then
    charged=$((charged + SECONDS - build_t0 - b))
    msg+="; rehearsal: not cut off, charged its budget of $b s"
  fi
  case $rc in 124 | 137) return "$rc" ;; esac
  ((${#broken[@]} == 0))
}

# Shared libraries outside the system folders at run time: libbenchmark from <build>/deps and NCCL's
# folder (the wheel's lib/ holds only libnccl.so.2). The programs' RUNPATH names them too;
# LD_LIBRARY_PATH also covers programs run from elsewhere.
runtime_env() {
  local dirs=() d lib
  for d in "$build/deps/usr/lib/x86_64-linux-gnu" "$build/deps/usr/lib"; do
    compgen -G "$d/*.so*" >/dev/null && dirs+=("$d")
  done
  lib=$(cache_get NCCL_LIBRARY)
  [[ -f $lib ]] && dirs+=("$(dirname "$lib")")
  if ((${#dirs[@]})); then
    LD_LIBRARY_PATH=$(IFS=:; echo "${dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
  fi
}

# ---------------------------------------------------------------------------------------------
# test
# ---------------------------------------------------------------------------------------------
step_test() {
  local b=$1 rc=0 logf=$results/cuda-tests.log
  [[ -n $tests ]] || { msg="no cuda tests configured (Catch2 v2 missing? see configure.log)"; return 1; }
  local n pass skip fail
  # --stop-time caps every test's own timeout (900 s) at the step's deadline, so a hanging test is
  # reported as a timeout by CTest while the others' results stay.
  limited $((b + 5)) "$logf" ctest --test-dir "$build" -L cuda --output-on-failure -j "${CTEST_JOBS:-1}" \
    --stop-time "$(date -d "@$(($(date +%s) + b - 3))" +%H:%M:%S)" || rc=$?
  local total bad
  total=$(wc -w <<<"$tests")
  n=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$logf" || true)
  pass=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#.* Passed' "$logf" || true)
  skip=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#.*Skipped' "$logf" || true)
  fail=$((n - pass - skip))
  # "name (Failed)", "name (Timeout)", "name (Exception: SegFault)", ...
  bad=$(grep -E '^ *[0-9]+/[0-9]+ Test +#' "$logf" | grep -vE ' Passed|Skipped' |
        sed -E 's/.*#[0-9]+: ([^ ]+) .*\*\*\*([A-Za-z: ]*[A-Za-z]).*/\1 (\2)/' | paste -sd, - || true)
  if ((n < total)); then
    bad+="${bad:+, }$((total - n)) not started (out of time)"
    ((rc == 124 || rc == 137)) || rc=124
  fi
  if ((rehearsal)); then
    msg="rehearsal: $n of $total tests ran: $skip skipped (exit 77: no GPU), $pass passed, $fail other"
    ((n == total && fail == 0)) && return 0
    msg+=": $bad"
    return 1
  fi
  case $rc in 124 | 137) msg="$pass of $total passed before the cut: $bad"; return "$rc" ;; esac
  if ((total > 0 && pass == total)); then msg="ok: all $total passed"; return 0; fi
  msg="$pass of $total passed"
  ((skip == 0)) || msg+=", $skip SKIPPED (the CUDA runtime saw no usable device: driver older than CUDA 13?)"
  [[ -n $bad ]] && msg+="; $bad"
  return 1
}

# ---------------------------------------------------------------------------------------------
# benchmarks, PyTorch baselines, fit
# ---------------------------------------------------------------------------------------------
# gbench BUDGET PROGRAM NAME [ARGS...]: Google Benchmark JSON on stdout, line-buffered into NAME.json
# as each benchmark finishes (a run cut off keeps the finished entries; gpu_report.py closes the
# JSON), the console table into NAME.txt, stderr into NAME.log.
gbench() {
  local b=$1 prog=$2 name=$3 rc=0
  shift 3
  [[ -x $(program "$prog") ]] || { msg="not built"; return 1; }
  set +e
  timeout --kill-after=5 "$b" stdbuf -oL "$(program "$prog")" --benchmark_format=json \
    --benchmark_out="$results/$name.txt" --benchmark_out_format=console --benchmark_min_time="$min_time" "$@" \
    >"$results/$name.json" 2> >(tee "$results/$name.log" >&2)
  rc=$?
  set -e
  if ! grep -q '^{' "$results/$name.json" 2>/dev/null; then
    # No JSON: the program printed a note instead (no CUDA device) or nothing at all.
    cat "$results/$name.json" >>"$results/$name.log"
    local note
    note=$(head -c 200 "$results/$name.json" | tr '\n' ' ')
    rm -f "$results/$name.json"
    if ((rehearsal)) && [[ $rc == 0 && $note == *"no CUDA device"* ]]; then
      msg="rehearsal: ran, printed its no-device note"
      return 0
    fi
    msg="no JSON written (exit $rc): ${note:-no output}"
    ((rc == 0)) && return 1
    return "$rc"
  fi
  local count
  count=$(grep -c '"run_name"' "$results/$name.json" || true)
  cat "$results/$name.txt" 2>/dev/null || true
  msg="$count benchmarks in $name.json"
  grep -q '"error_occurred": true' "$results/$name.json" && msg+="; some SKIPPED WITH ERROR (see $name.json)"
  return "$rc"
}

step_kernels() { gbench "$1" bench_cuda_moe bench_cuda_moe --benchmark_filter="$kernel_filter" ${BENCH_GEMM:+--gemm=$BENCH_GEMM}; }
step_layer() { gbench "$1" bench_cuda_moe bench_cuda_moe.layer --benchmark_filter="$layer_filter" ${BENCH_GEMM:+--gemm=$BENCH_GEMM}; }
step_shuffle() { gbench "$1" bench_cuda_shuffle bench_cuda_shuffle; }
step_split() { gbench "$1" bench_cuda_batch_split bench_cuda_batch_split; }

torch_part() {
  local b=$1 part=$2 rc=0
  if [[ -n ${SKIP_TORCH:-} ]]; then msg="skipped (SKIP_TORCH)"; return 0; fi
  PYTHONUNBUFFERED=1 limited "$b" "$results/torch-$part.log" "$python" "$root/scripts/gpu_torch_baselines.py" \
    --part "$part" --out "$results/torch_baselines.json" --data "$root/tests/data" || rc=$?
  if ((rc == 3)); then
    # PyTorch is optional: its absence is reported, not counted as a failure.
    msg="NOT MEASURED: $(grep -m1 'gpu_torch_baselines:' "$results/torch-$part.log" | sed 's/^gpu_torch_baselines: //')"
    ((rehearsal)) && msg="rehearsal: $msg"
    return 0
  fi
  msg="rows in torch_baselines.json (see torch-$part.log)"
  return "$rc"
}
step_torch_gemm() { torch_part "$1" gemm; }
step_torch_split() {
  local b=$1 rc=0
  if [[ -n ${SKIP_TORCH:-} ]]; then msg="skipped (SKIP_TORCH)"; return 0; fi
  PYTHONUNBUFFERED=1 limited "$b" "$results/torch-split.log" "$python" "$root/scripts/gpu_torch_split.py" \
    --lib "$(program moe_compose_cuda)" --out "$results/torch_split.json" || rc=$?
  if ((rc == 3)); then
    msg="NOT MEASURED: $(grep -m1 'gpu_torch_split:' "$results/torch-split.log" | sed 's/^gpu_torch_split: //')"
    ((rehearsal)) && msg="rehearsal: $msg"
    return 0
  fi
  msg="rows in torch_split.json (see torch-split.log)"
  ((rc == 0)) || msg="FAILED: a check or an error (see torch-split.log)"
  return "$rc"
}
step_torch_layer() { torch_part "$1" layer; }

step_fit() {
  local b=$1 rc=0 reps=9
  [[ -x $(program findep_fit_gpu) ]] || { msg="not built"; return 1; }
  # Fewer rounds when little time is left (each round measures all 159 points once).
  ((b < 90)) && reps=3
  limited "$b" "$results/findep_fit_gpu.txt" "$(program findep_fit_gpu)" --reps "$reps" \
    --out "$results/findep_gpu_models.tsv" --samples "$results/findep_gpu_samples.tsv" || rc=$?
  if ((rehearsal)); then
    if grep -q 'no usable CUDA device' "$results/findep_fit_gpu.txt" && ((rc == 1)); then
      msg="rehearsal: ran, stopped with its no-device error"
      echo "$msg" >"$results/findep_fit_status.txt"
      return 0
    fi
  fi
  case $rc in
    0) msg="ok: all six models reach R^2 >= 0.99 (--reps $reps)" ;;
    124 | 137) msg="cut off by its budget (--reps $reps)" ;;
    *) msg="an error, or a model with R^2 < 0.99 (see findep_fit_gpu.txt)" ;;
  esac
  echo "$msg" >"$results/findep_fit_status.txt"
  return "$rc"
}

# ---------------------------------------------------------------------------------------------
tests="" targets=() missing=()
if [[ $mode == dry-run ]]; then
  run_step configure
  # Each later step gets its whole cap when the steps before it (configure as it just ran, the
  # others at most their caps) leave enough time; the table says how much they may take.
  before=$(elapsed)
  for s in "${steps[@]:1}"; do
    budget_of[$s]=${cap[$s]}
    status_of[$s]="dry run: gets its whole cap if the steps before it end within $((budget - reserve - cap[$s])) s (they may take up to $before s)"
    before=$((before + cap[$s]))
  done
  report
  log "targets the run builds: ${targets[*]}"
  column -t -s $'\t' "$results/steps.tsv" || cat "$results/steps.tsv"
  [[ ${status_of[configure]} == ok* ]] || exit 1
  exit 0
fi

run_step configure
if [[ ${status_of[configure]} == FAILED* && ${#targets[@]} -eq 0 ]]; then
  for s in "${steps[@]:1}"; do status_of[$s]="not run: configure failed"; done
  exit 1
fi
build_t0=$SECONDS
run_step build
runtime_env
for s in "${steps[@]:2}"; do run_step "$s"; done
((failed)) && exit 1
((cut)) && exit 2
exit 0
