#!/usr/bin/env python3
"""Where a kernel's code goes: its disassembly with line information (`nvdisasm -g`), read per stage
and per source line. A companion of kernel_code_size.py for kernels whose time follows the code they
run once (docs/results/batch-balance.md, "The kernel's code").

    nvcc -std=c++20 -O3 -arch=sm_90a -lineinfo -Iinclude -Ibenchmarks/planners -Itests/support \\
         -Itests --expt-relaxed-constexpr -cubin tests/cuda/test_batch_split_cuda.cu -o /tmp/split.cubin
    nvdisasm -g /tmp/split.cubin > /tmp/split.sass      # nvdisasm: CUDA toolkit (or a wheel that ships it)
    python3 scripts/kernel_lines.py /tmp/split.sass batch_split_kernelILi256ELb1 [--lines N] [--from A --to B]

Prints the kernel's size, then its stages: the code between consecutive clock reads (CS2R
SR_CLOCKLO, i.e. clock64(); the split kernel reads it after each stage for DeviceSplitStages), then
the N source lines with the most instructions in the kernel (or in the address range [A, B), hex),
each with the number of separate runs of instructions it has: a line with many runs is either
inlined at several places or interleaved by the scheduler. Standard library only."""
import argparse
import collections
import os
import re
import sys

LINE = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
INSN = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*)")
SECTION = re.compile(r"^\s*\.section\s+\.text\.(\S+?),")


def read_kernel(path, name):
    """(address, (file, line) or None, instruction text) of the kernel whose mangled name contains
    `name` (the first such .text section)."""
    try:
        lines = open(path, errors="replace").read().split("\n")
    except OSError as e:
        raise SystemExit(f"{path}: cannot read it ({e.strerror})")
    out, inside, where, found = [], False, None, None
    for text in lines:
        m = SECTION.match(text)
        if m:
            if inside:
                break
            inside = name in m.group(1)
            if inside:
                found = m.group(1)
            continue
        if not inside:
            continue
        m = LINE.match(text)
        if m:
            where = (m.group(1), int(m.group(2)))
            continue
        m = INSN.match(text)
        if m and not m.group(2).startswith("."):
            out.append((int(m.group(1), 16), where, m.group(2)))
    if found is None:
        raise SystemExit(f"{path}: no .text section whose kernel name contains {name!r} "
                         "(is it the output of nvdisasm -g?)")
    if not out:
        raise SystemExit(f"{path}: the section of {found} holds no instructions")
    return found, out


def source_text(where):
    path, line = where
    try:
        return open(path, errors="replace").read().split("\n")[line - 1].strip()
    except (OSError, IndexError):
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass", help="nvdisasm -g output")
    ap.add_argument("kernel", help="a substring of the kernel's mangled name")
    ap.add_argument("--lines", type=int, default=20, help="source lines to list (default 20)")
    ap.add_argument("--from", dest="lo", default=None, help="first address (hex) of the range to list")
    ap.add_argument("--to", dest="hi", default=None, help="address (hex) past the range to list")
    args = ap.parse_args()
    name, insns = read_kernel(args.sass, args.kernel)
    end = insns[-1][0] + 16
    print(f"{name}: {end} bytes, {len(insns)} instructions")
    clocks = [a for a, _, text in insns if "SR_CLOCKLO" in text]
    if len(clocks) >= 2:
        print("between clock reads (bytes): " +
              "  ".join(f"{k + 1}: {b - a}" for k, (a, b) in enumerate(zip(clocks, clocks[1:]))))
    lo = int(args.lo, 16) if args.lo else 0
    hi = int(args.hi, 16) if args.hi else end
    count, runs, prev = collections.Counter(), collections.Counter(), None
    for a, where, _ in insns:
        if not lo <= a < hi:
            prev = None
            continue
        count[where] += 1
        if where != prev:
            runs[where] += 1
        prev = where
    print(f"source lines in [{lo:#x}, {hi:#x}): instructions, runs, line")
    for where, n in count.most_common(args.lines):
        label = "(no line)" if where is None else f"{os.path.basename(where[0])}:{where[1]}"
        text = "" if where is None else source_text(where)[:90]
        print(f"{n:6d} {runs[where]:4d}  {label:28s} {text}")


if __name__ == "__main__":
    sys.exit(main())
