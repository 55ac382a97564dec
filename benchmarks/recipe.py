"""Which training recipe: initialization and optimizer, measured on ARD RBF (split 0).

    LAZYKERN_DATA=/path/to/uci_datasets python benchmarks/recipe.py [--datasets pumadyn32nm kin40k]

Recipes (every run in a fresh process, float32, exact Cholesky likelihood):

* ``gpytorch-defaults/adam50``: GPyTorch's initial values (lengthscales 0.69, noise 0.69) and 50
  Adam steps at lr 0.1 (lazykern's previous recipe);
* ``dimension-init/adam``: lazykern's initialization (lengthscales sqrt(d), noise 0.01), Adam with
  the plateau schedule and convergence stop of :func:`lazykern.regression.train`;
* ``dimension-init/lbfgs``: the same initialization, L-BFGS with a strong-Wolfe line search (the default).

Writes ``benchmarks/results/recipe.json`` (one record per run, resumable) and ``recipe.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
N_TRAIN = {"pumadyn32nm": 1500}
RECIPES = ("gpytorch-defaults/adam50", "dimension-init/adam", "dimension-init/lbfgs")


def worker(job: dict) -> dict:
    import time

    import gpytorch
    import torch

    from lazykern.data import load_uci
    from lazykern.regression import build_model, gaussian_metrics, make_kernel, predict, train

    torch.manual_seed(0)
    torch.set_flush_denormal(True)
    data = load_uci(job["dataset"], split=0, n_train=job["n_train"], dtype=torch.float32)
    init, optimizer = job["recipe"].split("/")
    if init == "gpytorch-defaults":
        model, likelihood = build_model(data.train_x, data.train_y, make_kernel("rbf-ard", data.d))
        likelihood.noise = 0.6931  # GPyTorch's softplus(0), which build_model overrides
    else:
        model, likelihood = build_model(data.train_x, data.train_y, "rbf-ard")
    start = time.perf_counter()
    with gpytorch.settings.max_cholesky_size(job["n_train"]):
        if optimizer == "adam50":
            opt = torch.optim.Adam(model.parameters(), lr=0.1)
            mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
            model.train()
            likelihood.train()
            losses = []
            for _ in range(50):
                opt.zero_grad()
                loss = -mll(model(data.train_x), data.train_y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        else:
            losses = train(model, likelihood, iters=200, optimizer=optimizer, progress=False)
        seconds = time.perf_counter() - start
        rmse, nlpd = gaussian_metrics(*predict(model, likelihood, data.test_x), data.test_y)
    return {**job, "rmse": rmse, "nlpd": nlpd, "final_loss": losses[-1], "evaluations": len(losses),
            "train_seconds": seconds, "noise": likelihood.noise.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["pumadyn32nm", "kin40k"])
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    path = RESULTS / "recipe.json"
    records = json.loads(path.read_text()) if path.exists() else []
    for dataset in args.datasets:
        for recipe in RECIPES:
            job = {"dataset": dataset, "recipe": recipe, "n_train": N_TRAIN.get(dataset, args.n_train)}
            if any(all(r.get(k) == v for k, v in job.items()) for r in records):
                continue
            print(f"{dataset} / {recipe} ...", flush=True)
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                                  text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            record = (json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0
                      else {**job, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]})
            records.append(record)
            path.write_text(json.dumps(records, indent=1) + "\n")
            print("   ", record, flush=True)
    lines = ["# Training recipe (ARD RBF, split 0, float32, exact likelihood)", "",
             "| dataset | n_train | recipe | test RMSE | test NLPD | final loss | loss evaluations | train s | noise |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['dataset']} | {r['n_train']} | {r['recipe']} | failed: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['dataset']} | {r['n_train']} | {r['recipe']} | {r['rmse']:.3f} | {r['nlpd']:.3f} | "
                     f"{r['final_loss']:.3f} | {r['evaluations']} | {r['train_seconds']:.0f} | {r['noise']:.3g} |")
    (RESULTS / "recipe.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
