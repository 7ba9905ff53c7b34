#!/usr/bin/env python3
"""Code size of each kernel in a CUDA cubin: the size of its .text.<kernel> section (bytes; an sm_90
instruction is 16 bytes). For a kernel that runs as one block and walks its code once per launch,
the code it runs is what its time follows (docs/results/batch-balance.md, "The kernel's code").

    nvcc -std=c++20 -O3 -arch=sm_90a -Iinclude -Ibenchmarks/planners -Itests/support -Itests \\
         --expt-relaxed-constexpr -cubin tests/cuda/test_batch_split_cuda.cu -o /tmp/split.cubin
    python3 scripts/kernel_code_size.py /tmp/split.cubin [substring of the kernel's mangled name]

Reads the ELF section table with the standard library alone (no binutils, no CUDA tools)."""
import struct
import sys


def sections(path):
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise SystemExit(f"{path}: cannot read it ({e.strerror})")
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit(f"{path}: not a 64-bit little-endian ELF file (a cubin: nvcc -cubin)")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shentsize < 64 or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise SystemExit(f"{path}: the ELF section table is missing or runs past the file")

    def header(i):
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, offset, size

    _, str_off, str_size = header(shstrndx)
    if str_off + str_size > len(data):
        raise SystemExit(f"{path}: the section names run past the file")
    for i in range(shnum):
        name, _, size = header(i)
        if name >= str_size:
            raise SystemExit(f"{path}: section {i} names a string outside the string table")
        end = data.find(b"\0", str_off + name, str_off + str_size)
        if end < 0:
            raise SystemExit(f"{path}: section {i}'s name is not terminated")
        yield data[str_off + name:end].decode("ascii", "replace"), size


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    want = sys.argv[2] if len(sys.argv) == 3 else ""
    rows = [(n[len(".text."):], s) for n, s in sections(sys.argv[1]) if n.startswith(".text.") and want in n]
    for name, size in sorted(rows, key=lambda r: -r[1]):
        print(f"{size:9d} bytes  {size // 16:7d} instructions  {name}")


if __name__ == "__main__":
    main()
