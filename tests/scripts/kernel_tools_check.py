#!/usr/bin/env python3
"""The kernel code tools (scripts/kernel_code_size.py, scripts/kernel_lines.py) against files the
real tools wrote and an independent reader.

Fixtures (tests/scripts/data): two_kernels.cu, compiled by nvcc 13.1 (`nvcc -O3 -arch=sm_90a
-lineinfo -cubin`) into two_kernels.cubin, disassembled by nvdisasm 13.1 (`nvdisasm -g`) into
two_kernels.sass, whose `//## File` lines were then pointed at the repository's copy of the source.
- kernel_code_size.py: each kernel's size equals the size binutils' readelf gives its .text section
  (the values readelf gave when the fixture was made, where readelf is missing).
- kernel_lines.py: the kernel `staged`, its clock reads (CS2R SR_CLOCKLO at 0x20, 0x180, 0x1c0 in
  the fixture: 352 and 64 bytes between them), and the instructions of its source line 5, counted
  once with awk on the fixture (18, in two runs); a kernel that is not there is an error naming it.
Run from the repository root; prints "kernel_tools: ok" when every check holds."""
import os
import re
import shutil
import subprocess
import sys

DATA = "tests/scripts/data"
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAILED:", what)


def run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True)


# kernel_code_size.py against readelf
cubin = os.path.join(DATA, "two_kernels.cubin")
got = {}
r = run("scripts/kernel_code_size.py", cubin)
check(r.returncode == 0, f"kernel_code_size.py exits 0 (stderr: {r.stderr.strip()})")
for line in r.stdout.splitlines():
    m = re.match(r"\s*(\d+) bytes\s+(\d+) instructions\s+(\S+)$", line)
    if m:
        got[m.group(3)] = int(m.group(1))
        check(int(m.group(2)) * 16 == int(m.group(1)), f"instructions are 16 bytes each: {line}")
want = {"_Z6stagediPKiPiPx": 0x300, "_Z5plainPi": 0x180}  # readelf -SW, when the fixture was made
if shutil.which("readelf"):
    out = subprocess.run(["readelf", "-SW", cubin], capture_output=True, text=True).stdout
    want = {}
    for line in out.splitlines():
        m = re.search(r"\.text\.(\S+)\s+PROGBITS\s+[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)", line)
        if m:
            want[m.group(1)] = int(m.group(2), 16)
check(len(want) == 2 and got == want, f"kernel sizes {got} equal readelf's {want}")
r = run("scripts/kernel_code_size.py", os.path.join(DATA, "two_kernels.cu"))
check(r.returncode != 0 and "not a 64-bit little-endian ELF" in (r.stdout + r.stderr),
      "kernel_code_size.py refuses a file that is not a cubin, saying so")

# kernel_lines.py on nvdisasm's output
sass = os.path.join(DATA, "two_kernels.sass")
r = run("scripts/kernel_lines.py", sass, "staged", "--lines", "20")
check(r.returncode == 0, f"kernel_lines.py exits 0 (stderr: {r.stderr.strip()})")
lines = r.stdout.splitlines()
check(bool(lines) and lines[0] == "_Z6stagediPKiPiPx: 768 bytes, 48 instructions", "size line of `staged`")
check("between clock reads (bytes): 1: 352  2: 64" in lines, "the code between the three clock reads")
row = [l for l in lines if "two_kernels.cu:5 " in l]
check(len(row) == 1 and row[0].split()[:2] == ["18", "2"], f"line 5: 18 instructions in 2 runs (got {row})")
check(bool(row) and "s += in[i];" in row[0], "line 5's source text")
total = sum(int(l.split()[0]) for l in lines[3:])
check(total == 48, f"the listed lines hold all 48 instructions (got {total})")
r = run("scripts/kernel_lines.py", sass, "staged", "--from", "180", "--to", "1c0")
rows = [l for l in r.stdout.splitlines()[3:]]
check(sum(int(l.split()[0]) for l in rows) == 4, f"[0x180, 0x1c0) holds 4 instructions (got {rows})")
r = run("scripts/kernel_lines.py", sass, "plain")
check(r.returncode == 0 and r.stdout.startswith("_Z5plainPi: 384 bytes, 24 instructions"), "the kernel `plain`")
check("between clock reads" not in r.stdout, "no stages in a kernel without clock reads")
r = run("scripts/kernel_lines.py", sass, "missing_kernel")
check(r.returncode != 0 and "missing_kernel" in (r.stdout + r.stderr), "a kernel that is not there is named")

if failures:
    print(f"kernel_tools: {len(failures)} check(s) failed")
    sys.exit(1)
print("kernel_tools: ok")
