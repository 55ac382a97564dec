"""Projected additive kernels against ARD on a UCI subset: fixed or learned directions, one or per-projection lengthscales.

Each run trains with :func:`lazykern.regression.fit_evaluate` (the recipe of ``lazykern uci``) in a fresh
process, one thread, on the same random training subset (``--n-train`` points of each split of ``--splits``,
seed 0, float32; exact Cholesky up to ``--max-cholesky`` points, else conjugate gradients with Adam, whose
stochastic estimates are seeded with 0 too):

* ``recipe``: the named ``dpa-matern52`` kernel (:func:`lazykern.regression.make_kernel`): diverse fixed
  directions, one learned lengthscale per input dimension divided out before projecting;
* ``dpa``: ``ScaleKernel(ProjectedAdditiveKernel(MaternKernel(nu=2.5), d, J))``, diverse directions, fixed,
  one lengthscale shared by the projections, no input lengthscales;
* ``dpa-lengthscales``: the same with one lengthscale per projection (``ard_num_dims=J``);
* ``learned``: directions trained with the other hyperparameters (``learn_projections=True``), from DPA's;
* ``learned-lengthscales``: both;
* ``learned-ard``: learned directions starting from DPA's divided by ARD RBF's lengthscales, fitted
  exactly on 1,000 of the points (:func:`lazykern.regression.ard_scaled_directions`; its time is in the
  training time);
* ``learned-ard-floor``: the same with the noise variance bounded below by that ARD fit's
  (:func:`lazykern.regression.build_model`'s ``noise_floor``);
* ``ard``: the recipe's ``rbf-ard``, the reference, always exact (Cholesky).

Usage::

    LAZYKERN_DATA=../shared/uci python benchmarks/projected_variants.py            # pol, J = d, n = 1,000
    python benchmarks/projected_variants.py --datasets elevators --projections 36 --jobs 2
    python benchmarks/projected_variants.py --datasets pol elevators kin40k protein --n-train 5000 \
        --variants recipe ard --projections-per-dim 2 --max-cholesky 2000 --out benchmarks/results/projected-5000

Writes ``benchmarks/results/projected-variants.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = ("recipe", "dpa", "dpa-lengthscales", "learned", "learned-lengthscales", "learned-ard", "learned-ard-floor",
            "ard")

CHILD = r"""
import json, sys, time
import gpytorch, torch, lazykern
from lazykern.data import load_uci
from lazykern.regression import ard_scaled_directions, fit_evaluate

spec = json.loads(sys.argv[1])
torch.manual_seed(0)  # the conjugate-gradient path's training draws probe vectors (as `lazykern uci --seed 0`)
data = load_uci(spec["dataset"], split=spec["split"], n_train=spec["n_train"], dtype=torch.float32)
d, J, variant = data.train_x.shape[1], spec["projections"], spec["variant"]
exact = spec["n_train"] if variant == "ard" else spec["max_cholesky"]
named = {"ard": "rbf-ard", "recipe": "dpa-matern52"}  # by name: the whole recipe (initialization, floors)
started, directions, floor = time.perf_counter(), "dpa", None
if variant == "learned-ard":
    directions = ard_scaled_directions(data.train_x, data.train_y, J, 1000, progress=False)
elif variant == "learned-ard-floor":
    directions, floor = ard_scaled_directions(data.train_x, data.train_y, J, 1000, progress=False, return_noise=True)
start_seconds = time.perf_counter() - started
if variant in named:
    kernel = named[variant]
else:
    base = lazykern.MaternKernel(nu=2.5, ard_num_dims=J if variant.endswith("lengthscales") else None)
    kernel = gpytorch.kernels.ScaleKernel(lazykern.ProjectedAdditiveKernel(
        base, d, J, projections=directions, learn_projections=variant.startswith("learned")))
result = fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel=kernel, progress=False,
                      analyze=False, max_cholesky_size=exact, y_scale=data.y_std,
                      num_projections=J if variant == "recipe" else None, iters=spec["iters"],
                      warm_start_size=None if variant == "ard" else spec["warm_start"], noise_floor=floor)
print("RESULT", json.dumps({"rmse": result.rmse, "nlpd": result.nlpd,
                            "train_seconds": start_seconds + result.train_seconds,
                            "d": d, "J": J, "solver": result.solver, "interventions": result.interventions,
                            "iterations": result.iterations, "converged": result.converged,
                            "stop_reason": result.stop_reason, "final_loss": result.final_loss,
                            "noise_floor": floor}))
"""


def measure(spec: dict) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**spec, **json.loads(line[len("RESULT "):])}
    return {**spec, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["pol"])
    parser.add_argument("--splits", nargs="+", type=int, default=[0])
    parser.add_argument("--n-train", type=int, default=1000)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--projections", type=int, default=None, help="J (default: the dataset's d)")
    group.add_argument("--projections-per-dim", type=int, default=None, help="J = this times d")
    parser.add_argument("--max-cholesky", type=int, default=None,
                        help="projected kernels: exact up to this many points (default: n_train)")
    parser.add_argument("--warm-start", type=int, default=None, metavar="M",
                        help="projected kernels: start from an exact fit on M of the points")
    parser.add_argument("--iters", type=int, default=200, help="most optimizer iterations (the recipe's: 200)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--out", type=Path, default=RESULTS / "projected-variants")
    args = parser.parse_args()
    from lazykern.data import load_uci

    def projections(dataset: str) -> int:
        d = load_uci(dataset, split=0, n_train=10).train_x.shape[1]
        return args.projections or (args.projections_per_dim or 1) * d

    max_cholesky = args.n_train if args.max_cholesky is None else args.max_cholesky
    specs = [{"dataset": ds, "split": split, "n_train": args.n_train, "projections": projections(ds),
              "max_cholesky": max_cholesky, "warm_start": args.warm_start, "iters": args.iters, "variant": v}
             for ds in args.datasets for split in args.splits for v in args.variants]
    from lazykern.cache_paths import cpu_model

    meta = {"machine": cpu_model().split("; flags")[0], "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv)}
    records = []
    with ThreadPoolExecutor(args.jobs) as pool:
        # Written after every run: a long regeneration stopped early keeps what it measured.
        for record in pool.map(measure, specs):
            records.append(record)
            text = write(args, meta, max_cholesky, records)
    print(text)


def write(args: argparse.Namespace, meta: dict, max_cholesky: int, records: list[dict]) -> str:
    """Writes the records so far to ``args.out`` (``.json`` and ``.md``); returns the Markdown."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    lines = [f"# Projected additive kernels against ARD ({meta['date']})", "",
             f"`{meta['command']}`; {meta['machine']}, {meta['cores']} cores, {args.jobs} runs at once, one thread "
             f"each. n_train = {args.n_train}, float32 (refined in float64 on the exact path), exact Cholesky up to "
             f"{max_cholesky} points for the projected kernels, always for ARD (the recipe of `lazykern uci`)"
             + (f"; the projected kernels start from an exact fit on {args.warm_start} of the points."
                if args.warm_start else "."), "",
             "| dataset | split | variant | J | solver | test RMSE | test NLPD | training (s) | iterations |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        head = f"| {r['dataset']} | {r['split']} | {r['variant']} | {r['projections']} |"
        if "error" in r:
            lines.append(f"{head} | {r['error']} | | | |")
        else:
            # NaN: fit_evaluate withheld it, LOVE's variances being off (the record's interventions say so)
            nlpd = "withheld" if math.isnan(r["nlpd"]) else f"{r['nlpd']:.3f}"
            lines.append(f"{head} {r['solver']} | {r['rmse']:.4f} | {nlpd} | {r['train_seconds']:.0f} | "
                         f"{r['iterations']} ({r['stop_reason']}) |")
    text = "\n".join(lines) + "\n"
    args.out.with_suffix(".md").write_text(text)
    return text

if __name__ == "__main__":
    main()
