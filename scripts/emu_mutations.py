#!/usr/bin/env python3
"""Plants bugs in the CUDA code one at a time and shows which check of the emulator catches each.

For every mutation the script resets a scratch worktree of this repository (default
/tmp/moe-mutations, at HEAD), applies the one edit, rebuilds one emulated test (`*_emu`) in the
build flavour the mutation names (plain, ASan + UBSan, or ThreadSanitizer), runs it with a Catch2
filter, and classifies the result:

  test        the test's own assertions failed
  emulator    the emulator reported a contract violation or divergence (a "moe-emu:" message with
              a failing run)
  ASan / TSan the sanitizer reported the bug
  NOT CAUGHT  the run passed: the check the mutation is for is missing

    scripts/emu_mutations.py                 # all mutations, prints a markdown table
    scripts/emu_mutations.py --only lda,cub  # some of them
    scripts/emu_mutations.py --list
    scripts/emu_mutations.py --work /tmp/mine --jobs 1   # another scratch worktree, one build job

The baseline (no mutation) must pass in every flavour used, or the table means nothing; the script
checks it first. Results are recorded in docs/results/emu-mutations.md.
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Mutation:
    def __init__(self, key, what, path, old, new, flavour, target, filt):
        self.key, self.what, self.path, self.old, self.new = key, what, path, old, new
        self.flavour, self.target, self.filt = flavour, target, filt


GG = "include/moe/kernels/grouped_gemm.cuh"
SM90 = "include/moe/kernels/grouped_gemm_sm90.cuh"
MUTATIONS = [
    Mutation("barrier", "removed the per-slice `__syncthreads` of the WMMA grouped GEMM", GG,
             "      if (more) stash(cur ^ 1);\n      __syncthreads();\n    }\n    // The stage buffers are dead now",
             "      if (more) stash(cur ^ 1);\n    }\n    // The stage buffers are dead now",
             "tsan", "test_cuda_kernels_emu", "grouped GEMM*"),
    Mutation("ring-slot", "wrong ring slot: the next K slice is staged into the slot being read", GG,
             "      if (more) stash(cur ^ 1);\n      __syncthreads();\n    }\n    // The stage buffers are dead now",
             "      if (more) stash(cur);\n      __syncthreads();\n    }\n    // The stage buffers are dead now",
             "plain", "test_cuda_kernels_emu", "grouped GEMM*"),
    Mutation("fragment-order", "element-order assumption on a WMMA accumulator fragment (lane-major store)", GG,
             "        wmma::store_matrix_sync(C0s + off, acc0[i][j], ldc, wmma::mem_row_major);",
             "        for (int e = 0; e < acc0[i][j].num_elements; ++e) {\n"
             "          int idx = (tid & 31) * acc0[i][j].num_elements + e;\n"
             "          C0s[off + (idx / 16) * ldc + idx % 16] = acc0[i][j].x[e];\n"
             "        }\n"
             "        __syncwarp();",
             "plain", "test_cuda_kernels_emu", "grouped GEMM*"),
    Mutation("sm90-swizzle", "wrong swizzle XOR in the Hopper kernel's shared-memory stores (`r mod 4` for `r mod 8`)",
             SM90, "((ch ^ (r0 & 7)) << 4)", "((ch ^ (r0 & 3)) << 4)",
             "plain", "test_cuda_kernels_emu", "grouped GEMM*"),
    Mutation("sm90-wait", "`cp.async.wait_group` one too weak in the Hopper kernel (2 for 1: slice kt's copies may be in flight)",
             SM90, "    cp_async_wait<ahead - 1>();", "    cp_async_wait<ahead>();",
             "plain", "test_cuda_kernels_emu", "grouped GEMM*"),
    Mutation("sm90-ring-slot", "wrong ring slot in the Hopper kernel: slice t is staged into slot (t + 1) mod 4, "
             "the slot of a slice whose wgmma may still run", SM90,
             "    std::uint32_t sa = smem0 + static_cast<std::uint32_t>(kt % stages) * stage_bytes;",
             "    std::uint32_t sa = smem0 + static_cast<std::uint32_t>((kt + 1) % stages) * stage_bytes;",
             "plain", "test_cuda_kernels_emu", "grouped GEMM*"),
    Mutation("sm90-wgmma-wait", "`wgmma.wait_group` one too weak in the Hopper kernel (2 for 1: a slot is refilled "
             "while its wgmma runs)", SM90, "    wgmma_wait<1>();", "    wgmma_wait<2>();",
             "plain", "test_cuda_kernels_emu", "grouped GEMM*"),
    Mutation("bound", "off-by-one kernel bound in `combine_records_kernel` (`q <= vecs`)",
             "include/moe/kernels/combine.cuh",
             "(back + static_cast<std::size_t>(r) * hidden);\n  for (int q = static_cast<int>(threadIdx.x); q < vecs;",
             "(back + static_cast<std::size_t>(r) * hidden);\n  for (int q = static_cast<int>(threadIdx.x); q <= vecs;",
             "asan", "test_cuda_kernels_emu", "*"),
    Mutation("lda", "wrong `lda` in the gate's `cublasGemmEx` (hidden - 1)", "include/moe/kernels/gate.cuh",
             "hidden, x, cuda_type<T>, hidden,", "hidden - 1, x, cuda_type<T>, hidden,",
             "plain", "test_cuda_kernels_emu", "*gate*"),
    Mutation("cub-temp", "too-small CUB temporary storage for `DeviceScan::ExclusiveSum` (size - 1)",
             "include/moe/kernels/dispatch.cuh",
             "             \"cub::DeviceScan::ExclusiveSum (size query)\");\n  return bytes;",
             "             \"cub::DeviceScan::ExclusiveSum (size query)\");\n  return bytes - 1;",
             "plain", "test_cuda_kernels_emu", "*"),
    Mutation("stream-wait", "dropped `cudaStreamWaitEvent` joining the shared-expert stream in the device `Layer`",
             "include/moe/layer/paths/device.cuh",
             "    if (shared_acc) kc::check_cuda(cudaStreamWaitEvent(s, join_.get(), 0), \"cudaStreamWaitEvent (shared experts)\");",
             "",
             "tsan", "device_layer_tests_emu", "[shared-stream]"),
    Mutation("shuffle-mask", "warp shuffle whose mask leaves out a lane that calls it (gate top-k)",
             "include/moe/kernels/gate.cuh",
             "    int oi = __shfl_xor_sync(0xffffffffu, i, off);",
             "    int oi = __shfl_xor_sync(0x7fffffffu, i, off);",
             "plain", "test_cuda_kernels_emu", "*rout*"),
    Mutation("fork-wait", "dropped fork `cudaStreamWaitEvent` in the FinDEP CUDA executor",
             "include/moe/layer/findep_cuda_executor.cuh",
             "    for (auto s : streams) kc::check_cuda(cudaStreamWaitEvent(s, events[event], 0), \"cudaStreamWaitEvent (fork)\");",
             "",
             "tsan", "test_findep_cuda_emu", "*CUDA graph*"),
    Mutation("group-end", "missing `ncclGroupEnd` in `collective::Nccl`'s group guard",
             "include/moe/collective/nccl.hpp",
             "    open_ = false;\n    nccl_call(comm_, ncclGroupEnd(), \"ncclGroupEnd\");",
             "    open_ = false;",
             "plain", "test_nccl_ranks_emu", "*"),
    Mutation("block-scan", "a block scan that only some threads join (`tile_starts_kernel`)",
             "include/moe/kernels/dispatch.cuh",
             "    Scan(scratch).ExclusiveSum(tiles, before, chunk);",
             "    if (threadIdx.x != 5) Scan(scratch).ExclusiveSum(tiles, before, chunk);",
             "plain", "test_cuda_kernels_emu", "*"),
]

FLAVOURS = {"plain": [], "asan": ["-DMOE_SANITIZE=ON"], "tsan": ["-DMOE_SANITIZE=thread"]}


def sh(cmd, cwd, timeout=None, env=None):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout


def prepare(work):
    if not os.path.isdir(work):
        rc, out = sh(["git", "worktree", "add", "--detach", work, "HEAD"], ROOT)
        if rc:
            sys.exit(out)
    else:
        sh(["git", "checkout", "--detach", "-f", subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()], work)


def build_dir(work, flavour):
    b = os.path.join(work, "build-mut-" + flavour)
    if not os.path.exists(os.path.join(b, "CMakeCache.txt")):
        rc, out = sh(["cmake", "-S", work, "-B", b, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DMOE_ENABLE_CUDA=OFF",
                      "-DMOE_AREAS=emu", "-DMOE_BUILD_EXAMPLES=OFF", "-DMOE_BUILD_TOOLS=OFF", "-DMOE_BUILD_BENCHMARKS=OFF"] + FLAVOURS[flavour], work)
        if rc:
            sys.exit(out)
    return b


JOBS = 2


def run(work, flavour, target, filt):
    b = build_dir(work, flavour)
    rc, out = sh(["cmake", "--build", b, f"-j{JOBS}", "--target", target], work)
    if rc:
        return "build failed", out
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0"
    env["TSAN_OPTIONS"] = "halt_on_error=1"
    try:
        rc, out = sh([os.path.join(b, "tests", "emu", target), filt], work, timeout=900, env=env)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    if "No test cases matched" in out:
        return "no such case in this build", out
    if "ThreadSanitizer:" in out:
        return "TSan", out
    if "AddressSanitizer:" in out or "runtime error:" in out:
        return "ASan", out
    if rc == 0:
        return "NOT CAUGHT", out
    if re.search(r"moe-emu: kernel .*:", out) or "moe-emu: cub::" in out or "moe-emu: cublas" in out:
        return "emulator", out
    return "test", out


def first_line(out, kind):
    pats = {"TSan": r"(WARNING: ThreadSanitizer: [^\n]*)", "ASan": r"(ERROR: AddressSanitizer: [^\n]*|runtime error: [^\n]*)",
            "emulator": r"(moe-emu: [^\n]*)", "test": r"(FAILED:[^\n]*\n[^\n]*)"}
    m = re.search(pats.get(kind, r"$^"), out)
    return re.sub(r"\s+", " ", m.group(1))[:160] if m else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/moe-mutations")
    ap.add_argument("--only", default="")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=2, help="parallel build jobs (default 2)")
    args = ap.parse_args()
    global JOBS
    JOBS = args.jobs
    chosen = [m for m in MUTATIONS if not args.only or m.key in args.only.split(",")]
    if args.list:
        for m in chosen:
            print(f"{m.key:15} {m.flavour:5} {m.target:24} {m.what}")
        return 0
    prepare(args.work)
    for flavour, target, filt in sorted({(m.flavour, m.target, m.filt) for m in chosen}):
        kind, out = run(args.work, flavour, target, filt)
        if kind != "NOT CAUGHT":
            sys.exit(f"baseline {target} [{filt}] ({flavour}) does not pass: {kind}\n{out[-3000:]}")
    rows, missed = [], 0
    for m in chosen:
        path = os.path.join(args.work, m.path)
        sh(["git", "checkout", "--", "."], args.work)
        text = open(path).read()
        if text.count(m.old) != 1:
            sys.exit(f"mutation {m.key}: the text to replace occurs {text.count(m.old)} times in {m.path}")
        open(path, "w").write(text.replace(m.old, m.new))
        t0 = time.time()
        kind, out = run(args.work, m.flavour, m.target, m.filt)
        missed += kind in ("NOT CAUGHT", "build failed", "timeout")
        rows.append((m, kind, first_line(out, kind), time.time() - t0))
        print(f"{m.key}: {kind}", file=sys.stderr)
    sh(["git", "checkout", "--", "."], args.work)
    print("| mutation | build | test run | caught by | first report |")
    print("|---|---|---|---|---|")
    for m, kind, line, secs in rows:
        print(f"| {m.what} (`{m.key}`) | {m.flavour} | `{m.target} \"{m.filt}\"` | **{kind}** | {line.replace('|', '/')} |")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
