"""Projected additive kernels against ARD on a UCI subset: fixed or learned directions, one or per-projection lengthscales.

Each run trains with :func:`lazykern.regression.fit_evaluate` (the recipe of ``lazykern uci``) in a fresh
process, one thread, on the same random training subset (``--n-train`` points of split ``--split``, seed 0,
float32, exact Cholesky):

* ``dpa``: ``ScaleKernel(ProjectedAdditiveKernel(MaternKernel(nu=2.5), d, J))``, diverse directions, fixed,
  one lengthscale shared by the projections (the recipe's ``dpa-matern52``);
* ``dpa-lengthscales``: the same with one lengthscale per projection (``ard_num_dims=J``);
* ``learned``: directions trained with the other hyperparameters (``learn_projections=True``), from DPA's;
* ``learned-lengthscales``: both;
* ``ard``: the recipe's ``rbf-ard``, the reference.

Usage::

    LAZYKERN_DATA=../shared/uci python benchmarks/projected_variants.py            # pol, J = d, n = 1,000
    python benchmarks/projected_variants.py --dataset elevators --projections 36 --jobs 2

Writes ``benchmarks/results/projected-variants.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = ("dpa", "dpa-lengthscales", "learned", "learned-lengthscales", "ard")

CHILD = r"""
import json, sys, time
import gpytorch, torch, lazykern
from lazykern.data import load_uci
from lazykern.regression import fit_evaluate

spec = json.loads(sys.argv[1])
data = load_uci(spec["dataset"], split=spec["split"], n_train=spec["n_train"], dtype=torch.float32)
d, J, variant = data.train_x.shape[1], spec["projections"], spec["variant"]
if variant == "ard":
    kernel = "rbf-ard"
else:
    base = lazykern.MaternKernel(nu=2.5, ard_num_dims=J if variant.endswith("lengthscales") else None)
    kernel = gpytorch.kernels.ScaleKernel(lazykern.ProjectedAdditiveKernel(
        base, d, J, projections="dpa", learn_projections=variant.startswith("learned")))
result = fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel=kernel, progress=False,
                      analyze=False, max_cholesky_size=spec["n_train"], y_scale=data.y_std)
print("RESULT", json.dumps({"rmse": result.rmse, "nlpd": result.nlpd, "train_seconds": result.train_seconds,
                            "d": d}))
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
    parser.add_argument("--dataset", default="pol")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--projections", type=int, default=None, help="J (default: the dataset's d)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--out", type=Path, default=RESULTS / "projected-variants")
    args = parser.parse_args()
    if args.projections is None:
        from lazykern.data import load_uci

        args.projections = load_uci(args.dataset, split=args.split, n_train=10).train_x.shape[1]
    specs = [{"dataset": args.dataset, "split": args.split, "n_train": args.n_train, "projections": args.projections,
              "variant": v} for v in args.variants]
    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(measure, specs))
    from lazykern.cache_paths import cpu_model

    meta = {"machine": cpu_model().split("; flags")[0], "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    lines = [f"# Projected additive kernels against ARD ({meta['date']})", "",
             f"`{meta['command']}`; {meta['machine']}, {meta['cores']} cores, {args.jobs} runs at once, one thread "
             f"each. {args.dataset}, split {args.split}, n_train = {args.n_train}, J = {args.projections}, float32 "
             "then refined in float64, exact Cholesky (the recipe of `lazykern uci`).", "",
             "| variant | test RMSE | test NLPD | training (s) |", "|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['error']} | | |")
        else:
            lines.append(f"| {r['variant']} | {r['rmse']:.4f} | {r['nlpd']:.3f} | {r['train_seconds']:.0f} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
