"""Solves with additive kernels: CG iterations by preconditioner, one MLL step, predictions, memory.

Every measurement runs in a fresh subprocess (1 thread; peak RSS from ``/proc/self/status`` VmHWM,
above the interpreter's baseline after imports). Kernels:
``ScaleKernel(AdditiveStructureKernel(MaternKernel(nu=2.5) or RBFKernel(), d, component_scales))``
with lengthscale 1, outputscale 1 and component scales 1/d (a signal of variance 1) on the
standardized inputs of :func:`lazykern.data.synthetic_additive` (d = 8), float64, noise
:math:`\\sigma^2` relative to that signal.

* ``candidates``: N = 2,000, every candidate applied densely (exact per-dimension solves
  :math:`(s_j K_j + \\sigma^2 I)^{-1}` as dense inverses): none, GPyTorch's default rank-15 pivoted
  Cholesky (and rank 100), additive Schwarz :math:`\\frac1d \\sum_j (s_j K_j + \\sigma^2 I)^{-1}`,
  backfitting (symmetric block Gauss-Seidel over the dimensions, 1 and 2 sweeps), and the grid
  preconditioner (:mod:`lazykern.structured.grid`);
* ``cg``: :func:`lazykern.solvers.cg` on ``kernel(X) + sigma^2 I`` (the structured engine's
  products) with no preconditioner, :class:`~lazykern.solvers.PivotedCholeskyPreconditioner` of rank
  15 (GPyTorch's default) and 100, and :class:`~lazykern.solvers.GridPreconditioner`, to relative residuals
  1e-2 (GPyTorch's ``eval_cg_tolerance``) and 1e-6 (``cg``'s default), at most 1,000 iterations
  (``cg``'s default);
* ``mll``: one step of ``-mll(model(X), y)`` and its backward pass under GPyTorch's defaults
  (``fast_computations``: CG and SLQ with ``linear_operator``'s preconditioner hook), with the grid
  preconditioner and with preconditioning off (``max_preconditioner_size(0)``);
* ``accuracy``: the loss of that step at N = 5,000 by Cholesky and by SLQ with and without the
  preconditioner (3 seeds of the probes);
* ``predict``: posterior mean and variance (``fast_pred_var``: LOVE) at M test points, the caches
  built in the same process.

Usage::

    nice -n 5 python benchmarks/structured_solves.py            # about 10 minutes on one core
    python benchmarks/structured_solves.py --million            # and N = 10^6 on 2 threads
    python benchmarks/structured_solves.py --quick              # N = 2,000 and 10^4 only

Writes ``benchmarks/results/structured-solves.json`` and ``.md``.
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
from linear_operator import settings as lo_settings
from lazykern.data import synthetic_additive, load_uci
from lazykern.solvers import cg, GridPreconditioner, PivotedCholeskyPreconditioner
from lazykern.structured.grid import AdditiveGrid
from lazykern.formulas import StationaryFormula
from lazykern.operators import LazyKernelOperator

torch.set_num_threads(json.loads(sys.argv[1]).get("threads", 1))  # 1 unless the row asks for more
F64 = torch.float64

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024

spec = json.loads(sys.argv[1])
kind, n, family, noise = spec["kind"], spec["n"], spec["family"], spec["noise"]
if spec.get("dataset"):
    data = load_uci(spec["dataset"], split=0, data_dir=spec["data_dir"])
else:
    data = synthetic_additive(n_train=n, n_test=spec.get("m", 10), d=8, seed=0)
x, y = data.train_x, data.train_y
d = x.shape[-1]
base = lazykern.MaternKernel(nu=2.5) if family == "matern" else lazykern.RBFKernel()
kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=d, component_scales=True)).double()
kernel.base_kernel.base_kernel.lengthscale = 1.0
kernel.outputscale = 1.0
kernel.base_kernel.component_scales = torch.full((1, d), 1.0 / d)
baseline = rss_mb()
out = {}

def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start

if kind == "candidates":
    one = StationaryFormula("matern", nu=2.5) if family == "matern" else StationaryFormula("rbf")
    with torch.no_grad():
        terms = [one(x[:, None, j:j + 1], x[None, :, j:j + 1]).squeeze(-1) / d for j in range(d)]
        eye = torch.eye(n, dtype=F64)
        A = sum(terms) + noise * eye
        inverses = [torch.linalg.inv(t + noise * eye) for t in terms]
        smoothers = [t @ inv for t, inv in zip(terms, inverses)]   # A_j (A_j + s^2 I)^{-1}
        schwarz = sum(inverses) / d

        def backfitting(sweeps):
            order = list(range(d)) + list(range(d - 1, -1, -1))
            def apply(r):
                parts, total = [torch.zeros_like(r) for _ in range(d)], torch.zeros_like(r)
                for sweep in range(sweeps):
                    for j in order if sweep == 0 else order[1:]:
                        total -= parts[j]
                        parts[j] = smoothers[j] @ (r - total)
                        total += parts[j]
                return (r - total) / noise
            return apply

        grid = AdditiveGrid(one, x, torch.full((d,), 1.0 / d, dtype=F64), torch.full((n,), noise, dtype=F64))
        candidates = {
            "none": None,
            "pivoted Cholesky, rank 15": PivotedCholeskyPreconditioner(A - noise * eye, 15, noise),
            "pivoted Cholesky, rank 100": PivotedCholeskyPreconditioner(A - noise * eye, 100, noise),
            "additive Schwarz": lambda r: schwarz @ r,
            "backfitting, 1 sweep": backfitting(1),
            "backfitting, 2 sweeps": backfitting(2),
            "grid": grid.solve,
        }
        b = y[:, None]
        for name, precond in candidates.items():
            out[name] = {str(tol): cg(A, b, precond=precond, tol=tol)[1].iterations for tol in (1e-2, 1e-6)}
elif kind == "cg":
    with torch.no_grad():
        K = kernel(x).evaluate_kernel()
        A = K.add_diagonal(torch.tensor(noise, dtype=F64))
        b = y[:, None]
        A @ b  # the first product sorts
        _, out["product_s"] = timed(lambda: A @ b)
        grid, out["grid_build_s"] = timed(lambda: GridPreconditioner(K, noise))
        out["grid_rank"] = grid.grid.rank
        _, out["grid_apply_s"] = timed(lambda: grid(b))
        runs = {"grid": grid}
        if not spec.get("grid_only"):
            runs = {"none": None, "pivoted Cholesky, rank 15": PivotedCholeskyPreconditioner(K, 15, noise), **runs}
            runs["pivoted Cholesky, rank 100"], out["pivoted_100_build_s"] = timed(
                lambda: PivotedCholeskyPreconditioner(K, 100, noise))
        for name, precond in runs.items():
            for tol in (1e-2, 1e-6):
                result, seconds = timed(lambda: cg(A, b, precond=precond, tol=tol, max_iter=1000)[1])
                out[f"{name} {tol:g}"] = {"iterations": result.iterations, "converged": result.all_converged,
                                          "seconds": round(seconds, 2)}
elif kind == "mll":
    model, likelihood = lazykern.regression.build_model(x, y, kernel)
    likelihood.noise = noise
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    products = []
    matmul = LazyKernelOperator._matmul
    LazyKernelOperator._matmul = lambda self, rhs: products.append(rhs.shape[-1]) or matmul(self, rhs)
    size = 15 if spec["preconditioner"] else 0
    with lo_settings.max_preconditioner_size(size):
        loss, seconds = timed(lambda: (-mll(model(x), y)).backward() or 0)
    out.update(seconds=round(seconds, 2), products=len(products), columns=sum(products))
elif kind == "accuracy":
    model, likelihood = lazykern.regression.build_model(x, y, kernel)
    likelihood.noise = noise
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    with torch.no_grad():
        with gpytorch.settings.max_cholesky_size(10**6):
            out["cholesky"] = float(mll(model(x), y))
        for size, name in ((15, "grid"), (0, "off")):
            values = []
            for seed in range(3):
                torch.manual_seed(seed)
                with lo_settings.max_preconditioner_size(size):
                    values.append(float(mll(model(x), y)))
            out[name] = values
elif kind == "predict":
    m = spec["m"]
    model, likelihood = lazykern.regression.build_model(x, y, kernel)
    likelihood.noise = noise
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        def predict():
            posterior = likelihood(model(data.test_x))
            return posterior.mean, posterior.variance
        (mean, var), out["seconds"] = timed(predict)
        out["rmse"] = float((mean - data.test_y).square().mean().sqrt())
        out["mean_variance"] = float(var.mean())
out["peak_mb_above_baseline"] = round(rss_mb() - baseline, 1)
print("RESULT " + json.dumps(out))
"""


def run(spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec.get("threads", 1)), "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"child failed for {spec}:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    print(f"{spec} ({time.perf_counter() - start:.0f} s): {result}", flush=True)
    return {**spec, **result}


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _data_dir(given: Path | None) -> str | None:
    for candidate in (given, os.environ.get("LAZYKERN_DATA"), ROOT.parent / "shared" / "uci"):
        if candidate and (Path(candidate) / "pol").is_dir():
            return str(candidate)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2,000 and 10^4 only")
    parser.add_argument("--million", action="store_true",
                        help="also one MLL step at N = 10^6 and predictions at 10^5 test points, on 2 threads")
    parser.add_argument("--data-dir", type=Path, help="a folder holding pol/ (else $LAZYKERN_DATA, else ../shared/uci)")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for family in ("matern", "rbf"):
        for noise in (0.01, 0.1):
            rows.append(run({"kind": "candidates", "n": 2000, "family": family, "noise": noise}))
    for family in ("matern", "rbf"):
        for noise in (0.01, 0.1):
            rows.append(run({"kind": "cg", "n": 10_000, "family": family, "noise": noise}))
    data_dir = _data_dir(args.data_dir)
    if data_dir:
        rows.append(run({"kind": "cg", "n": 0, "family": "matern", "noise": 0.01, "dataset": "pol", "data_dir": data_dir}))
    rows.append(run({"kind": "accuracy", "n": 5_000, "family": "matern", "noise": 0.01}))
    for preconditioner in (True, False):
        rows.append(run({"kind": "mll", "n": 10_000, "family": "matern", "noise": 0.01, "preconditioner": preconditioner}))
    if not args.quick:
        for family in ("matern", "rbf"):
            rows.append(run({"kind": "cg", "n": 100_000, "family": family, "noise": 0.01}))
        for preconditioner in (True, False):
            rows.append(run({"kind": "mll", "n": 100_000, "family": "matern", "noise": 0.01,
                             "preconditioner": preconditioner}))
        rows.append(run({"kind": "predict", "n": 100_000, "m": 100_000, "family": "matern", "noise": 0.01}))
        rows.append(run({"kind": "cg", "n": 1_000_000, "family": "matern", "noise": 0.01, "grid_only": True}))
    if args.million:
        rows.append(run({"kind": "mll", "n": 1_000_000, "family": "matern", "noise": 0.01, "preconditioner": True,
                         "threads": 2}))
        rows.append(run({"kind": "predict", "n": 1_000_000, "m": 100_000, "family": "matern", "noise": 0.01,
                         "threads": 2}))
    meta = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{_cpu()}, {os.cpu_count()} cores (1 thread used unless a row says 2), "
                   f"{platform.system()} {platform.release()}",
        "command": "python benchmarks/structured_solves.py" + (" --quick" if args.quick else "")
                   + (" --million" if args.million else ""),
        "torch": __import__("torch").__version__,
        "total_seconds": round(time.perf_counter() - started),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "structured-solves.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / "structured-solves.md").write_text(markdown(meta, rows))


def markdown(meta: dict, rows: list[dict]) -> str:
    kernel = {"matern": "Matérn 5/2", "rbf": "RBF"}
    lines = [
        f"# Solves with additive kernels ({meta['date']})",
        "",
        f"`{meta['command']}` on {meta['machine']}, torch {meta['torch']}; {meta['total_seconds']} s in all. "
        "Synthetic additive data (`synthetic_additive`, d = 8, standardized), lengthscale 1, a signal of variance 1 "
        "(outputscale 1, component scales 1/d), float64; noise σ² relative to that signal. CG iterations to relative "
        "residuals 1e-2 / 1e-6 (at most 1,000).",
        "",
        "## Candidates, N = 2,000 (dense; exact per-dimension solves as dense inverses)",
        "",
        "| kernel | σ² | " + " | ".join(k for k in rows[0] if k not in ("kind", "n", "family", "noise", "peak_mb_above_baseline")) + " |",
    ]
    names = [k for k in rows[0] if k not in ("kind", "n", "family", "noise", "peak_mb_above_baseline")]
    lines.append("|---|---|" + "---|" * len(names))
    for r in rows:
        if r["kind"] == "candidates":
            lines.append(f"| {kernel[r['family']]} | {r['noise']} | "
                         + " | ".join(f"{r[k]['0.01']} / {r[k]['1e-06']}" for k in names) + " |")
    lines += ["", "## CG on the lazy operator (structured engine's products)", "",
              "| data | kernel | N | σ² | none | pivoted Cholesky, rank 15 | pivoted Cholesky, rank 100 | grid | grid rank | "
              "grid build | grid application | one product | peak MB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(r, name):
        if f"{name} 0.01" not in r:
            return "not run"
        a, b = r[f"{name} 0.01"], r[f"{name} 1e-06"]
        mark = "" if b["converged"] else " (not converged)"
        return f"{a['iterations']} / {b['iterations']}{mark} ({b['seconds']} s)"

    for r in rows:
        if r["kind"] == "cg":
            source = "pol (split 0, d = 26)" if r.get("dataset") else "synthetic (d = 8)"
            lines.append(f"| {source} | {kernel[r['family']]} | {r['n'] or 'all'} | {r['noise']} | {cell(r, 'none')} | "
                         f"{cell(r, 'pivoted Cholesky, rank 15')} | {cell(r, 'pivoted Cholesky, rank 100')} | {cell(r, 'grid')} | {r['grid_rank']} | "
                         f"{r['grid_build_s']:.2f} s | {r['grid_apply_s']:.3f} s | {r['product_s']:.3f} s | "
                         f"{r['peak_mb_above_baseline']} |")
    lines += ["", "## One MLL step and predictions (GPyTorch's defaults, Matérn 5/2, σ² = 0.01)", "",
              "| task | N | M | preconditioner | threads | seconds | kernel products (columns) | peak MB |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "mll":
            pre = "grid" if r["preconditioner"] else "off"
            lines.append(f"| loss + backward | {r['n']:,} | - | {pre} | {r.get('threads', 1)} | {r['seconds']} | "
                         f"{r['products']} ({r['columns']}) | "
                         f"{r['peak_mb_above_baseline']} |")
        if r["kind"] == "accuracy":
            accuracy = r
        if r["kind"] == "predict":
            lines.append(f"| mean + variance (LOVE) | {r['n']:,} | {r['m']:,} | grid (mean's solve) | "
                         f"{r.get('threads', 1)} | {r['seconds']:.1f} | - | "
                         f"{r['peak_mb_above_baseline']} |")
    a = accuracy
    lines += ["", f"The loss these steps compute, -MLL per point at N = {a['n']:,} (GPyTorch's defaults, 3 seeds of the probes): "
              f"Cholesky {-a['cholesky']:.5f}; SLQ with the grid preconditioner "
              + ", ".join(f"{-v:.5f}" for v in a["grid"]) + "; SLQ without preconditioner "
              + ", ".join(f"{-v:.5f}" for v in a["off"]) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
