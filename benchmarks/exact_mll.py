"""One exact training step (loss and gradient, Cholesky path): GPyTorch's likelihood against lazykern's ExactMLL.

Both are :math:`-\\log p(y)/n` of the same model at the same hyperparameters (the recipe's start,
:func:`lazykern.regression.build_model`) on ``--n-train`` points of a UCI split; GPyTorch's
:class:`~gpytorch.mlls.ExactMarginalLogLikelihood` differentiates through the Cholesky factor,
:class:`lazykern.regression.ExactMLL` uses :math:`K^{-1}` from it. One thread,
``OMP_WAIT_POLICY=PASSIVE``. Times: both likelihoods in one process, one step each to warm up, then
``--repeats`` steps of each, alternated, so that a load that comes and goes slows both alike. Loss,
gradient and the peak RSS increase over the state before the step: one step in a process of its own
per likelihood.

Usage::

    LAZYKERN_DATA=../shared/uci python benchmarks/exact_mll.py --dataset protein --n-train 5000 \\
        --kernels rbf-ard dpa-matern52 --projections 144 --out benchmarks/results/exact-mll

Writes ``benchmarks/results/exact-mll.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LIKELIHOODS = ("gpytorch", "lazykern")

CHILD = r"""
import json, resource, statistics, sys, time
import gpytorch, torch, lazykern.regression
from lazykern.data import load_uci
from lazykern.kernel_names import PROJECTED_KERNELS
from lazykern.regression import build_model

spec = json.loads(sys.argv[1])
data = load_uci(spec["dataset"], split=spec["split"], n_train=spec["n_train"], dtype=getattr(torch, spec["dtype"]))
projections = spec["projections"] if spec["kernel"] in PROJECTED_KERNELS else None
model, likelihood = build_model(data.train_x, data.train_y, spec["kernel"], num_projections=projections)
model.train(); likelihood.train()
classes = {"gpytorch": gpytorch.mlls.ExactMarginalLogLikelihood, "lazykern": lazykern.regression.ExactMLL}
mlls = {name: classes[name](likelihood, model) for name in spec["likelihoods"]}
params = [p for p in model.parameters() if p.requires_grad]

def step(mll):
    for p in params:
        p.grad = None
    with gpytorch.settings.max_cholesky_size(spec["n_train"]):
        loss = -mll(model(data.train_x), data.train_y)
        loss.backward()
    return loss

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
results = {}
for name, mll in mlls.items():  # one in a memory run: its own peak
    loss = step(mll)
    results[name] = {"loss": loss.item(), "grad": torch.cat([p.grad.reshape(-1) for p in params]).double().tolist(),
                     "peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, "times": []}
for _ in range(spec["repeats"]):  # alternated: a load that comes and goes slows both alike
    for name, mll in mlls.items():
        started = time.perf_counter(); step(mll); results[name]["times"].append(time.perf_counter() - started)
print("RESULT", json.dumps(results))
"""


def measure(spec: dict) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def run_kernel(spec: dict) -> dict:
    """Each likelihood's step time (both in one process, alternated), and its loss, gradient and peak
    RSS increase (each in a process of its own, one step)."""
    timed = measure({**spec, "likelihoods": LIKELIHOODS})
    if "error" in timed:
        return {name: timed for name in LIKELIHOODS}
    records = {}
    for name in LIKELIHOODS:
        alone = measure({**spec, "likelihoods": [name], "repeats": 0})
        records[name] = alone if "error" in alone else {
            **alone[name], "seconds": statistics.median(timed[name]["times"]), "times": timed[name]["times"]}
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="protein")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--kernels", nargs="+", default=["rbf-ard", "dpa-matern52"])
    parser.add_argument("--projections", type=int, default=None, help="J of projected kernels (default: the recipe's)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "exact-mll")
    args = parser.parse_args()
    from lazykern.cache_paths import cpu_model

    meta = {"machine": cpu_model().split("; flags")[0], "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv)}
    specs = {kernel: {"dataset": args.dataset, "split": args.split, "n_train": args.n_train, "kernel": kernel,
                      "projections": args.projections, "dtype": args.dtype, "repeats": args.repeats}
             for kernel in args.kernels}
    records = [{"kernel": kernel, "likelihood": name, **record}
               for kernel, spec in specs.items() for name, record in run_kernel(spec).items()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    lines = [f"# One exact training step: GPyTorch's likelihood against ExactMLL ({meta['date']})", "",
             f"`{meta['command']}`; {meta['machine']}, {meta['cores']} cores, one thread, {args.dataset} split "
             f"{args.split}, n = {args.n_train}, {args.dtype}, the recipe's initial hyperparameters. Step: loss and "
             f"gradient, median of {args.repeats}, the two likelihoods alternated in one process after one step "
             "each; ratio: the median of the alternated pairs' ratios; loss, gradient and peak RSS increase: one "
             "step in a process of its own.", "",
             "| kernel | likelihood | step (s) | ratio | peak RSS increase (MB) | loss difference | "
             "largest gradient difference (relative) |", "|---|---|---|---|---|---|---|"]
    for kernel in args.kernels:
        reference, ours = (next(r for r in records if r["kernel"] == kernel and r["likelihood"] == n)
                           for n in LIKELIHOODS)
        for r in (reference, ours):
            if "error" in r:
                lines.append(f"| {kernel} | {r['likelihood']} | {r['error']} | | | | |")
            elif r is reference or "error" in reference:
                lines.append(f"| {kernel} | {r['likelihood']} | {r['seconds']:.2f} | 1 | {r['peak_mb']:.0f} | | |")
            else:
                ratio = statistics.median(a / b for a, b in zip(r["times"], reference["times"]))
                grad = max(abs(a - b) for a, b in zip(r["grad"], reference["grad"])) / max(map(abs, reference["grad"]))
                lines.append(f"| {kernel} | {r['likelihood']} | {r['seconds']:.2f} | {ratio:.2f} | {r['peak_mb']:.0f} | "
                             f"{abs(r['loss'] - reference['loss']):.1e} | {grad:.1e} |")
    text = "\n".join(lines) + "\n"
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
