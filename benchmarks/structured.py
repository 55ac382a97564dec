"""The structured engine against the compiled pair engine, in one run: products, gradients, memory.

For each (kernel, N, d, engine, task) one fresh subprocess (peak RSS from ``/proc/self/status``
VmHWM, above the interpreter's baseline after imports and a warm-up on 300 points) times, as a
user's code reaches them through ``kernel(X)``:

* ``product``: ``K(X, X) @ V`` with 12 right-hand sides, no gradient (``max_dense_bytes(0)``: the
  lazy path, as at sizes where no N x N matrix fits);
* ``gradient``: the same product, backward to the lengthscales, the component scales and ``V``.

Kernels: ``ScaleKernel(AdditiveStructureKernel(MaternKernel(nu=2.5, ard), d, component_scales))``
and the same with ``RBFKernel``, float32 inputs (the engines compute the structured sums in float64).
Engines: ``structured`` and ``cpu`` (lazykern's compiled pair engine, what the chooser picked before
the structured engine), forced with ``lazykern.settings.engine``, and ``ski``: GPyTorch's additive
SKI, ``ScaleKernel(AdditiveStructureKernel(GridInterpolationKernel(base, grid_size, num_dims=1), d))``
with GPyTorch's own base kernel at the grid size its examples choose
(``gpytorch.utils.grid.choose_grid_size`` of one input column), with the relative RMSE of its product
against the exact one (the structured engine's, with the same hyperparameters) beside its time. The pair engine is skipped where
its N^2 d work would take more than ``--max-pair-seconds`` (estimated from its measured rate at
the smallest N). Times are medians of ``--repeats`` runs after a first one, timed apart (the
structured engine's first product sorts each dimension; later ones, a training loop's, reuse the
sort); ratios are taken within this run.

Usage::

    python benchmarks/structured.py --quick      # N = 2,000 and 13,500 (d = 26), 10^5 and 10^6 (d = 8)
    python benchmarks/structured.py --sizes 2000:26 13500:26 --repeats 3

Writes ``benchmarks/results/structured.json``, ``.md`` and ``.rst`` (the table for the docs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
COLUMNS = 12
#: The structured engine, lazykern's compiled pair engine, GPyTorch's additive SKI.
ENGINES = ("structured", "cpu", "ski")

CHILD = r"""
import json, os, statistics, sys, time
import torch, gpytorch, lazykern

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024

spec = json.loads(sys.argv[1])
n, d, engine, task, family = spec["n"], spec["d"], spec["engine"], spec["task"], spec["family"]
torch.manual_seed(0)

def lazy_kernel(component_scales):
    base = (lazykern.MaternKernel(nu=2.5, ard_num_dims=d) if family == "matern"
            else lazykern.RBFKernel(ard_num_dims=d))
    return gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=d,
                                                                        component_scales=component_scales))

def ski_kernel(x):
    base = gpytorch.kernels.MaternKernel(nu=2.5) if family == "matern" else gpytorch.kernels.RBFKernel()
    grid = gpytorch.utils.grid.choose_grid_size(x[:, :1])
    spec["grid_size"] = grid
    return gpytorch.kernels.ScaleKernel(gpytorch.kernels.AdditiveStructureKernel(
        gpytorch.kernels.GridInterpolationKernel(base, grid_size=grid, num_dims=1), num_dims=d))

def model(points):
    x = torch.randn(points, d)
    kernel = ski_kernel(x) if engine == "ski" else lazy_kernel(component_scales=True)
    v = torch.randn(points, COLUMNS, requires_grad=task == "gradient")
    return kernel, x, v

def run(kernel, x, v):
    if task == "product":
        with torch.no_grad():
            return kernel(x) @ v
    out = kernel(x) @ v
    out.square().sum().backward()
    return out

with lazykern.settings.engine("auto" if engine == "ski" else engine), lazykern.settings.max_dense_bytes(0):
    run(*model(300))  # compiles, first imports
    base = rss_mb()
    kernel, x, v = model(n)
    start = time.perf_counter()
    run(kernel, x, v)  # timed apart: the structured engine sorts each dimension here, once for a training loop
    first = time.perf_counter() - start
    times = []
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        out = run(kernel, x, v)
        times.append(time.perf_counter() - start)
    result = {"seconds": statistics.median(times), "times": times, "first_seconds": first, "peak_mb": rss_mb() - base}
    if engine == "ski":  # its error against the exact product, same hyperparameters (after the memory reading)
        with torch.no_grad(), lazykern.settings.engine("structured"):
            exact = lazy_kernel(component_scales=False)(x.double()) @ v.double()
        error = (out.detach().double() - exact).square().mean().sqrt() / exact.square().mean().sqrt()
        result.update(relative_rmse=float(error), grid_size=spec["grid_size"])
print("RESULT", json.dumps(result))
""".replace("COLUMNS", str(COLUMNS))


def measure(spec: dict) -> dict:
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["2000:26", "13500:26", "100000:8", "1000000:8"],
                        help="N:d pairs (default: the --quick set)")
    parser.add_argument("--quick", action="store_true", help="the default sizes, 5 repeats")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--families", nargs="+", default=["matern", "rbf"])
    parser.add_argument("--tasks", nargs="+", default=["product", "gradient"])
    parser.add_argument("--max-pair-seconds", type=float, default=120.0)
    parser.add_argument("--engines", nargs="+", default=["structured", "cpu", "ski"], choices=ENGINES)
    parser.add_argument("--max-ski-points", type=int, default=100_000,
                        help="SKI is skipped above this N (its FFTs of N grid points per dimension at 10^6: GBs)")
    parser.add_argument("--out", type=Path, default=RESULTS / "structured")
    args = parser.parse_args()
    sizes = [tuple(int(v) for v in s.split(":")) for s in args.sizes]
    records, pair_rate = [], {}
    for family in args.families:
        for task in args.tasks:
            for n, d in sizes:
                for engine in args.engines:
                    spec = {"n": n, "d": d, "engine": engine, "task": task, "family": family, "repeats": args.repeats}
                    rate = pair_rate.get((family, task))
                    if engine == "ski" and n > args.max_ski_points:
                        result = {"skipped": f"not run above {args.max_ski_points:,} points"}
                    elif engine == "cpu" and rate is not None and rate * n * n * d > args.max_pair_seconds:
                        result = {"skipped": f"estimated {rate * n * n * d:.0f} s from the rate at smaller N"}
                    else:
                        result = measure(spec)
                    if engine == "cpu" and "seconds" in result and (family, task) not in pair_rate:
                        pair_rate[(family, task)] = result["seconds"] / (n * n * d)
                    records.append({**spec, **result})
                    print(json.dumps(records[-1]), flush=True)
    from lazykern.cache_paths import cpu_model

    meta = {"machine": cpu_model().split("; flags")[0], "cores": os.cpu_count(),  # the model, not its flags
            "date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "command": " ".join(sys.argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    lines = [f"# Structured engine against the compiled pair engine and GPyTorch's additive SKI "
             f"({meta['date']}, {meta['cores']} cores)", "",
             f"`{meta['command']}`; {meta['machine']}; float32 inputs, {COLUMNS} right-hand sides, medians of "
             f"{args.repeats} after a first product timed apart; peak RSS above the warmed-up interpreter; SKI at the grid size GPyTorch's examples "
             "choose, its product's relative RMSE against the exact one.", "",
             "| kernel | task | N | d | structured | structured, first (sorts) | pair engine | ratio | SKI (grid) "
             "| SKI relative RMSE | structured peak MB | pair peak MB | SKI peak MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by_key = {(r["family"], r["task"], r["n"], r["d"], r["engine"]): r for r in records}

    def cell(r, key="seconds", fmt="{:.4f} s"):
        if r is None:
            return "not run"
        return fmt.format(r[key]) if key in r else r.get("skipped", r.get("error", "-"))

    for family in args.families:
        for task in args.tasks:
            for n, d in sizes:
                s, c, k = (by_key.get((family, task, n, d, e)) for e in ENGINES)
                ratio = f"{c['seconds'] / s['seconds']:.0f}x" if s and c and "seconds" in s and "seconds" in c else "-"
                ski = f"{cell(k)} ({k['grid_size']})" if k and "grid_size" in k else cell(k)
                lines.append(f"| {family} | {task} | {n:,} | {d} | {cell(s)} | {cell(s, 'first_seconds')} | "
                             f"{cell(c)} | {ratio} | {ski} | "
                             f"{cell(k, 'relative_rmse', '{:.1e}')} | {cell(s, 'peak_mb', '{:.0f}')} | "
                             f"{cell(c, 'peak_mb', '{:.0f}')} | {cell(k, 'peak_mb', '{:.0f}')} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    rows = [line.strip("|").split(" | ") for line in lines[6:]]  # the table's rows, below its two header lines
    header = ", ".join(f'"{h}"' for h in ("kernel", "task", "N", "d", "structured", "structured, first (sorts)",
                                           "pair engine", "ratio",
                                           "SKI (grid)", "SKI relative RMSE", "structured peak MB", "pair peak MB",
                                           "SKI peak MB"))
    rst = [f"Measured {meta['date']} on {meta['machine']} ({meta['cores']} cores) by ``{meta['command']}``: float32 "
           f"inputs, {COLUMNS} right-hand sides, medians of {args.repeats} after a first product timed apart, peak RSS above the warmed-up interpreter; "
           "SKI at the grid size GPyTorch's examples choose, its product's relative RMSE against the exact one.",
           "", ".. csv-table::", f"   :header: {header}", ""]
    rst += ["   " + ", ".join('"' + cell.strip().replace('"', "'") + '"' for cell in row) for row in rows]
    args.out.with_suffix(".rst").write_text("\n".join(rst) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
