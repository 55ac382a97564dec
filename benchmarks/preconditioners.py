"""Preconditioners for sums of many one-dimensional terms: CG iterations, build and solve times, memory.

The systems are :math:`A = K + \\sigma^2 I` with :math:`K` a sum of one-dimensional Matérn-5/2 terms
on the structured engine, float64:

* ``additive`` (synthetic): ``ScaleKernel(AdditiveStructureKernel(MaternKernel(nu=2.5), d,
  component_scales=True))`` on :func:`lazykern.data.synthetic_additive` inputs, lengthscale 1,
  outputscale 1, component scales 1/d (a signal of variance 1), noise 0.01; d = 8 and d = 100;
* ``projected`` (synthetic): ``ScaleKernel(ProjectedAdditiveKernel(MaternKernel(nu=2.5), 8, 64))``
  (J = 8d diverse directions) on the same inputs, signal variance 1, noise 0.01;
* ``kin40k`` and ``protein`` (UCI, split 0, all training points): the large-N recipe's starting
  model, a learned projected Matérn-5/2 kernel with J = 8d directions scaled by the lengthscales
  ARD RBF fits exactly on 2,000 of the points (:func:`lazykern.regression.ard_scaled_directions`), the
  noise at ARD's;
* ``gpytorch748``: GPyTorch #748's training loop on all of UCI pol (26 additive terms) timed by
  ``benchmarks/gpytorch748_loop.py`` with the grid preconditioner built for every step (the default),
  kept for ten steps (:class:`lazykern.settings.preconditioner_reuse`), and with
  ``linear_operator``'s rank-15 pivoted Cholesky instead.

For each system, in a fresh subprocess: the grid preconditioner (:mod:`lazykern.structured.grid`,
the rank ``linear_operator``'s path keeps), the pivoted Cholesky preconditioners of rank 15
(GPyTorch's default) and 100 (:class:`lazykern.solvers.PivotedCholeskyPreconditioner`), and none;
:func:`lazykern.solvers.cg` on ``[y, 4 standard normal columns]`` to relative residuals 1e-2 and 1e-6,
at most ``--max-iter`` iterations (fewer where a solve would take hours: ``none`` and the pivoted
Cholesky factors at N = 10^6). Peak RSS above the interpreter's after the data are loaded.

Usage::

    python benchmarks/preconditioners.py                 # everything, about an hour on 2 cores
    python benchmarks/preconditioners.py --quick         # N = 10^4 only, no UCI
    python benchmarks/preconditioners.py --data-dir /path/to/uci

Writes ``benchmarks/results/preconditioners.json`` and ``.md``.
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

CHILD = r"""
import json, sys, time
import torch, gpytorch, lazykern
from lazykern import backend
from lazykern.data import load_uci, synthetic_additive
from lazykern.solvers import cg, PivotedCholeskyPreconditioner
from lazykern.operators.preconditioning import _path_rank

spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
F64 = torch.float64

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM"))

def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start

if spec["system"] in ("kin40k", "protein"):
    from lazykern.regression import ard_scaled_directions
    data = load_uci(spec["system"], split=0, data_dir=spec["data_dir"], dtype=F64)
    x, y = data.train_x, data.train_y
    d = x.shape[-1]
    W, noise = ard_scaled_directions(x, y, 8 * d, size=2000, progress=False, return_noise=True)
    kernel = gpytorch.kernels.ScaleKernel(lazykern.ProjectedAdditiveKernel(
        lazykern.MaternKernel(nu=2.5), d, 8 * d, projections=W)).double()
else:
    d = spec["d"]
    data = synthetic_additive(n_train=spec["n"], n_test=10, d=8 if spec["system"] == "projected" else d, seed=0)
    x, y = data.train_x.double(), data.train_y.double()
    noise = 0.01
    if spec["system"] == "projected":
        kernel = gpytorch.kernels.ScaleKernel(lazykern.ProjectedAdditiveKernel(lazykern.MaternKernel(nu=2.5), 8, 64)).double()
    else:
        kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(
            lazykern.MaternKernel(nu=2.5), num_dims=d, component_scales=True)).double()
        kernel.base_kernel.base_kernel.lengthscale = 1.0
        kernel.base_kernel.component_scales = torch.full((1, d), 1.0 / d)
    kernel.outputscale = 1.0
baseline = rss_mb()
out = {"n": x.shape[0], "terms": None, "noise": noise}
with torch.no_grad():
    K = kernel(x).evaluate_kernel()
    out["terms"] = K.x1.shape[-1]
    A = K.add_diagonal(torch.tensor(noise, dtype=F64))
    B = torch.cat([y[:, None], torch.randn(x.shape[0], 4, dtype=F64, generator=torch.Generator().manual_seed(0))], 1)
    A @ B  # the first product sorts
    _, out["product_s"] = timed(lambda: A @ B)
    build = backend.preconditioner(K.covar_func, K.x1, K.tensor_params)
    grid, out["grid_build_s"] = timed(lambda: build(torch.full((x.shape[0],), noise, dtype=F64),
                                                     max_rank=_path_rank(*K.x1.shape)))
    out["grid_rank"] = grid.rank
    _, out["grid_apply_s"] = timed(lambda: grid.solve(B))
    runs = {"grid": (grid.solve, spec["max_iter"])}
    for rank in (15, 100):
        pc, out[f"pivoted_{rank}_build_s"] = timed(lambda: PivotedCholeskyPreconditioner(K, rank, noise))
        runs[f"pivoted Cholesky, rank {rank}"] = (pc, spec["slow_max_iter"])
    runs["none"] = (None, spec["slow_max_iter"])
    for name, (precond, cap) in runs.items():
        for tol in (1e-2, 1e-6):
            result, seconds = timed(lambda: cg(A, B, precond=precond, tol=tol, max_iter=cap)[1])
            out[f"{name} {tol:g}"] = {"iterations": result.iterations, "converged": result.all_converged,
                                      "seconds": round(seconds, 2)}
out["peak_mb_above_baseline"] = round(rss_mb() - baseline, 1)
print("RESULT " + json.dumps(out))
"""


def run(spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, json.dumps(spec)], capture_output=True,
                          text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"child failed for {spec}:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    print(f"{spec['system']} N={result['n']} ({time.perf_counter() - start:.0f} s): {result}", flush=True)
    return {**spec, **result}


def loop_748(data_dir: str, setting: str) -> dict:
    """GPyTorch #748's loop (``benchmarks/gpytorch748_loop.py``'s child) on the structured engine."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpytorch748_loop

    row = {"system": "gpytorch748", "setting": setting}
    for family in ("matern", "rbf"):
        spec = {"family": family, "engine": "structured", "steps": 20, "data_dir": data_dir, "setting": setting}
        result = gpytorch748_loop.run(spec)
        row[family] = {"seconds": result["seconds"], "last_loss": result["losses"][-1]} if "seconds" in result else result
    print(row, flush=True)
    return row


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def _data_dir(given: Path | None) -> str | None:
    for candidate in (given, os.environ.get("LAZYKERN_DATA"), ROOT.parent / "shared" / "uci"):
        if candidate and (Path(candidate) / "kin40k").is_dir():
            return str(candidate)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 10^4 only, no UCI data")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-iter", type=int, default=1000)
    parser.add_argument("--data-dir", type=Path, help="a folder holding kin40k/ (else $LAZYKERN_DATA, else ../shared/uci)")
    args = parser.parse_args()
    started = time.perf_counter()
    sizes = (10_000,) if args.quick else (10_000, 100_000, 1_000_000)
    systems = [("additive", 8), ("projected", 8), ("additive", 100)]
    rows = []
    for system, d in systems:
        for n in sizes:
            if d == 100 and n > 100_000:
                continue  # one product of 10^8 point-terms a column: the grid alone would take the hour
            slow = args.max_iter if n < 1_000_000 else 100
            rows.append(run({"system": system, "d": d, "n": n, "threads": args.threads, "max_iter": args.max_iter,
                             "slow_max_iter": slow}))
    data_dir = _data_dir(args.data_dir)
    if data_dir and not args.quick:
        for dataset in ("kin40k", "protein"):
            rows.append(run({"system": dataset, "data_dir": data_dir, "threads": args.threads,
                             "max_iter": args.max_iter, "slow_max_iter": args.max_iter}))
        for setting in ("grid", "grid-reused", "pivoted-cholesky"):
            rows.append(loop_748(data_dir, setting))
    meta = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{_cpu()}, {os.cpu_count()} cores, {args.threads} threads, {platform.system()} {platform.release()}",
        "command": "python benchmarks/preconditioners.py" + (" --quick" if args.quick else ""),
        "torch": __import__("torch").__version__,
        "total_seconds": round(time.perf_counter() - started),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "preconditioners.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / "preconditioners.md").write_text(markdown(meta, rows))


def _cell(row: dict, name: str) -> str:
    a, b = row[f"{name} 0.01"], row[f"{name} 1e-06"]
    mark = "" if b["converged"] else f" (not converged in {b['iterations']})"
    first = a["iterations"] if a["converged"] else f">{a['iterations']}"
    return f"{first} / {b['iterations'] if b['converged'] else '-'}{mark}, {a['seconds']} / {b['seconds']} s"


def markdown(meta: dict, rows: list[dict]) -> str:
    names = ("grid", "pivoted Cholesky, rank 15", "pivoted Cholesky, rank 100", "none")
    lines = [
        f"# Preconditioners for sums of many one-dimensional terms ({meta['date']})",
        "",
        f"`{meta['command']}` on {meta['machine']}, torch {meta['torch']}; {meta['total_seconds']} s in all. "
        "Matérn-5/2 terms on the structured engine, float64; `lazykern.solvers.cg` on [y, 4 normal columns]. "
        "Each cell: CG iterations to relative residuals 1e-2 / 1e-6, and the seconds of those solves "
        "(preconditioner builds separate).",
        "",
        "| system | N | terms | σ² | " + " | ".join(names) + " | grid rank | grid build | pivoted Cholesky 15 / 100 build | "
        "one product (5 columns) | grid application | peak MB |",
        "|---|---|---|---|" + "---|" * len(names) + "---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["system"] == "gpytorch748":
            continue
        lines.append(f"| {r['system']} | {r['n']:,} | {r['terms']} | {r['noise']:.3g} | "
                     + " | ".join(_cell(r, name) for name in names)
                     + f" | {r['grid_rank']} | {r['grid_build_s']:.2f} s | {r['pivoted_15_build_s']:.1f} / "
                     f"{r['pivoted_100_build_s']:.1f} s | {r['product_s']:.3f} s | {r['grid_apply_s']:.3f} s | "
                     f"{r['peak_mb_above_baseline']} |")
    loops = [r for r in rows if r["system"] == "gpytorch748"]
    if loops:
        lines += ["", "## GPyTorch #748's loop on all of pol (26 terms, 20 SGD steps, float32, structured engine)", "",
                  "| preconditioner | Matérn 5/2 | RBF |", "|---|---|---|"]
        def loop_cell(result: dict) -> str:
            if "error" in result:
                return f"failed: {result['error']}"
            return f"{result['seconds']:.1f} s (last loss {result['last_loss']:.4f})"

        for r in loops:
            lines.append(f"| {r['setting']} | {loop_cell(r['matern'])} | {loop_cell(r['rbf'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
