#!/usr/bin/env python3
"""PyTorch baselines for the GPU benchmarks of scripts/gpu_bench.sh, on the shapes bench_cuda_moe uses.

    python3 scripts/gpu_torch_baselines.py --part gemm  --out torch_baselines.json --data tests/data
    python3 scripts/gpu_torch_baselines.py --part layer --out torch_baselines.json --data tests/data

--part gemm   the grouped GEMMs alone with torch._grouped_mm (gate, up, SwiGLU, down), on
              random routes (rows) and on the real expert loads of GroupedGemmLoad (load_rows)
--part layer  a whole MoE layer forward, as PyTorch eager code would write it (a loop over the
              experts) and with torch._grouped_mm

The JSON file is rewritten after every row (to a temporary name, then renamed), so a run cut off by
its time limit leaves every finished row; a second part merges its rows into the same file. Exit
status: 0 done, 3 PyTorch or its CUDA device is missing (nothing measured), 1 on any other error.
The routers use softmax top-k for every model and leave out DeepSeek-V3's shared expert, so for
that model the layer baselines do slightly less work than our layer.
"""
import argparse
import json
import math
import os
import sys

# name: hidden, expert_ffn, experts, top_k (bench_cuda_moe's Layer and GroupedGemm shapes)
SHAPES = {
    "Mixtral-8x7B": (4096, 14336, 8, 2),
    "DeepSeek-V3": (7168, 2048, 256, 8),
    "Qwen3-30B-A3B": (2048, 768, 128, 8),
}
TOKENS = (128, 4096, 16384)
# GroupedGemmLoad: name: hidden, expert_ffn, experts, top_k, cases (name, folder, domain, layer position)
LOAD_SHAPES = {
    "OLMoE-1B-7B": (2048, 1024, 64, 8, [("uniform", None, None, 0), ("arxiv-L0", "olmoe-1b-7b", "arxiv", 0),
                                        ("c4-L15", "olmoe-1b-7b", "c4", 2)]),
    "Mixtral-8x7B": (4096, 14336, 8, 2, [("uniform", None, None, 0), ("github-L15", "mixtral-8x7b", "github", 2)]),
}


class Results:
    """The JSON file, merged row by row with what an earlier part wrote."""

    def __init__(self, path, version, device):
        self.path = path
        self.data = {"torch": version, "device": device, "rows": [], "load_rows": []}
        try:
            with open(path) as f:
                old = json.load(f)
            self.data["rows"] = old.get("rows", [])
            self.data["load_rows"] = old.get("load_rows", [])
        except (OSError, ValueError):
            pass

    def put(self, table, key, values):
        for row in self.data[table]:
            if all(row.get(k) == v for k, v in key.items()):
                row.update(values)
                break
        else:
            self.data[table].append(dict(key, **values))
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)
        print(dict(key, **values), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("gemm", "layer"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", required=True, help="folder holding olmoe-routing/ (tests/data)")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as exc:
        print(f"gpu_torch_baselines: PyTorch not importable ({exc}); nothing measured", flush=True)
        return 3
    if not torch.cuda.is_available():
        print(f"gpu_torch_baselines: torch {torch.__version__} sees no CUDA device; nothing measured", flush=True)
        return 3
    dev = torch.device("cuda")
    res = Results(args.out, torch.__version__, torch.cuda.get_device_name(0))

    def timed(fn, reps=10):
        fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / reps  # ms

    def weights(E, h, f, seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        rnd = lambda *s, fan: (torch.rand(*s, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1) / math.sqrt(fan)
        return g, rnd(E, f, h, fan=h), rnd(E, f, h, fan=h), rnd(E, h, f, fan=f), rnd(E, h, fan=h)

    def gemms(xs, offs, w1, w3, w2):
        a = torch._grouped_mm(xs, w1.transpose(-2, -1), offs=offs)
        b = torch._grouped_mm(xs, w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(F.silu(a) * b, w2.transpose(-2, -1), offs=offs)

    for name, (h, f, E, k) in SHAPES.items():
        g, w1, w3, w2, router = weights(E, h, f, 1)
        for T in TOKENS:
            key = {"model": name, "tokens": T}
            x = torch.randn(T, h, device=dev, generator=g, dtype=torch.bfloat16)

            def route():
                p = torch.softmax((x @ router.t()).float(), dim=-1)
                wts, ids = torch.topk(p, k, dim=-1)
                return ids, wts

            def grouped_parts():
                ids, wts = route()
                flat = ids.reshape(-1)
                order = torch.argsort(flat, stable=True)
                offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
                return order // k, offs, wts.reshape(-1)[order]

            if args.part == "gemm":
                try:
                    tok, offs, _ = grouped_parts()
                    xs = x[tok]
                    ms = timed(lambda: gemms(xs, offs, w1, w3, w2))
                    res.put("rows", key, {"grouped_mm_gemms_ms": ms, "grouped_mm_tflops": 6.0 * T * k * h * f / (ms / 1e3) / 1e12})
                except Exception as exc:  # report it and go on with the next shape
                    res.put("rows", key, {"grouped_mm_gemms_ms": None, "grouped_mm_error": str(exc)[:200]})
                continue

            def eager():
                ids, wts = route()
                y = torch.zeros(T, h, device=dev, dtype=torch.float32)
                for e in range(E):
                    tok, slot = (ids == e).nonzero(as_tuple=True)
                    if tok.numel() == 0:
                        continue
                    xe = x[tok]
                    o = (F.silu(xe @ w1[e].t()) * (xe @ w3[e].t())) @ w2[e].t()
                    y.index_add_(0, tok, o.float() * wts[tok, slot, None])
                return y.to(torch.bfloat16)

            def grouped():
                tok, offs, ws = grouped_parts()
                o = gemms(x[tok], offs, w1, w3, w2)
                y = torch.zeros(T, h, device=dev, dtype=torch.float32)
                y.index_add_(0, tok, o.float() * ws[:, None])
                return y.to(torch.bfloat16)

            for label, fn, reps in (("eager_ms", eager, 3), ("grouped_mm_layer_ms", grouped, 10)):
                try:
                    res.put("rows", key, {label: timed(fn, reps)})
                except Exception as exc:
                    res.put("rows", key, {label: None, label + "_error": str(exc)[:200]})
        del w1, w2, w3, router
        torch.cuda.empty_cache()

    if args.part != "gemm":
        return 0
    # The grouped GEMMs under real expert loads, as bench_cuda_moe's GroupedGemmLoad: tokens * top_k
    # rows split over the experts in proportion to one recorded layer's corpus counts (largest
    # remainder, ties to the lower expert: the same arithmetic as the C++), or evenly ("uniform").
    def split(weights_, rows):
        total = sum(weights_)
        q = [rows * w / total for w in weights_]
        n = [math.floor(v) for v in q]
        for e in sorted(range(len(q)), key=lambda e: (-(q[e] - n[e]), e))[:rows - sum(n)]:
            n[e] += 1
        return n

    def layer_counts(folder, domain, pos):
        per_layer = {}
        with open(os.path.join(args.data, "olmoe-routing", folder, domain, "expert_counts.tsv")) as fh:
            for line in fh:
                fields = line.split()
                if not fields or fields[0] == "layer":
                    continue
                c = per_layer.setdefault(int(fields[0]), {})
                c[int(fields[1])] = c.get(int(fields[1]), 0.0) + float(fields[2])
        c = per_layer[list(per_layer)[pos]]
        return [c.get(e, 0.0) for e in range(max(c) + 1)]

    for name, (h, f, E, k, cases) in LOAD_SHAPES.items():
        g, w1, w3, w2, _ = weights(E, h, f, 2)
        for T in TOKENS:
            for case, folder, domain, pos in cases:
                key = {"model": name, "load": case, "tokens": T}
                try:
                    n = split([1.0] * E if folder is None else layer_counts(folder, domain, pos), T * k)
                    offs = torch.cumsum(torch.tensor(n, device=dev), 0).to(torch.int32)
                    xs = torch.randn(T * k, h, device=dev, generator=g, dtype=torch.bfloat16)
                    ms = timed(lambda: gemms(xs, offs, w1, w3, w2))
                    res.put("load_rows", key, {"grouped_mm_gemms_ms": ms, "max_over_mean": max(n) / (T * k / E),
                                               "grouped_mm_tflops": 6.0 * T * k * h * f / (ms / 1e3) / 1e12})
                except Exception as exc:
                    res.put("load_rows", key, {"grouped_mm_gemms_ms": None, "grouped_mm_error": str(exc)[:200]})
        del w1, w2, w3
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
