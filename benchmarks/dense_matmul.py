"""CG's products on the dense cache: torch's ``K @ V`` (BLAS gemm) against ``lazykern.cpu.dense_matmul.dense_matmul``.

A training step on the dense path multiplies the cached N x N kernel matrix by a few columns (the
targets and the probe vectors: 11 with GPyTorch's defaults) once per CG iteration. Both products
run in ONE process, alternating call by call, on the same symmetric matrix; reported: the median
of each, their ratio, and the largest relative difference of the results. Memory-bound bound: one
read of K per product (N * N * itemsize bytes).

Usage::

    python benchmarks/dense_matmul.py                 # N = 5000, writes benchmarks/results/dense-matmul.*
    python benchmarks/dense_matmul.py --n 1000 --repeats 3 --out /tmp/dm   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from additive import machine  # noqa: E402  (one machine description for the benchmarks)


def measure(n: int, columns: list[int], repeats: int) -> list[dict]:
    import torch

    from lazykern.cpu.dense_matmul import dense_matmul

    rows = []
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        k = torch.rand(n, n, generator=gen, dtype=dtype)
        k = (k + k.T) / 2
        for c in columns:
            v = torch.randn(n, c, generator=gen, dtype=dtype)
            blas, ours = k @ v, dense_matmul(k, v)  # warm-up (and the compile of ours)
            diff = ((ours - blas).abs().max() / blas.abs().max()).item()
            times = {"torch": [], "lazykern": []}
            for _ in range(repeats):
                for name, fn in (("torch", lambda: k @ v), ("lazykern", lambda: dense_matmul(k, v))):
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            t, o = statistics.median(times["torch"]), statistics.median(times["lazykern"])
            rows.append({"dtype": str(dtype).split(".")[-1], "n": n, "columns": c, "torch_ms": 1e3 * t,
                         "lazykern_ms": 1e3 * o, "speedup": t / o, "max_rel_diff": diff})
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"Machine: {meta['cpu']}, {meta['cores']} cores; load average at start {meta['load_average_at_start'][0]:.1f}; "
        f"torch {meta['torch']}. Median of {meta['repeats']} alternating calls in one process.",
        "",
        "| dtype | N | columns | torch K @ V (ms) | lazykern.cpu.dense_matmul (ms) | speedup | max rel. diff |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['n']} | {r['columns']} | {r['torch_ms']:.1f} | {r['lazykern_ms']:.1f} | "
                     f"{r['speedup']:.2f} | {r['max_rel_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--columns", type=int, nargs="+", default=[2, 5, 11, 16])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dense-matmul")
    args = parser.parse_args(argv)
    meta = {**machine(), "repeats": args.repeats}
    rows = measure(args.n, args.columns, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"machine": meta, "rows": rows}, indent=1))
    table = markdown(rows, meta)
    args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
