"""The training loop of GPyTorch #748 on the whole of UCI pol, on lazykern's engines, timed.

GPyTorch #748 ("Memory-efficient additive kernels") ran out of a 12 GB GPU with an additive RBF
kernel on pol (N = 13,500 training points, d = 26). Its loop: an ``ExactGP`` with
``ScaleKernel(AdditiveStructureKernel(base, num_dims=26))``, 20 steps of SGD at learning rate 0.1
on the negative exact marginal log likelihood, under ``gpytorch.settings.fast_computations()``
(CG and Lanczos), ``skip_posterior_variances()`` and ``memory_efficient()``. Each engine runs it in
a fresh subprocess from the same initial hyperparameters (float32, the points of split 0 in the
uci_datasets layout, standardized with the training split's statistics); the structured engine's
trained hyperparameters (noise, output scale, lengthscales) are compared with the pair engine's
(largest relative difference; the mean's constant, near 0, absolutely). The losses differ from the
first step on: GPyTorch trains with CG to a loose tolerance (1) and a pivoted-Cholesky
preconditioner, whose solves differ between a stored matrix (the pair engine, within the dense
budget) and lazy products.

Usage::

    python benchmarks/gpytorch748_loop.py                      # Matérn 5/2 and RBF, both engines
    python benchmarks/gpytorch748_loop.py --engines structured --steps 5

Data: ``--data-dir`` (a folder holding ``pol/``), else ``$LAZYKERN_DATA``, else ``../shared/uci``.
Writes ``benchmarks/results/gpytorch748-loop.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

CHILD = r"""
import json, sys, time
import torch, gpytorch, lazykern
from lazykern.data import load_uci

spec = json.loads(sys.argv[1])
data = load_uci("pol", split=0, data_dir=spec["data_dir"])
x, y = data.train_x.float(), data.train_y.float()

class GP(gpytorch.models.ExactGP):
    def __init__(self):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean = gpytorch.means.ConstantMean()
        base = (lazykern.MaternKernel(nu=2.5, ard_num_dims=x.shape[-1]) if spec["family"] == "matern"
                else lazykern.RBFKernel(ard_num_dims=x.shape[-1]))
        self.covar = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=x.shape[-1]))

    def forward(self, inputs):
        return gpytorch.distributions.MultivariateNormal(self.mean(inputs), self.covar(inputs))

torch.manual_seed(0)
model = GP()
model.train()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
losses = []
setting = spec.get("setting", "grid")
if setting == "pivoted-cholesky":  # linear_operator's default preconditioner in place of the grid
    import lazykern.operators.kernel_operator as kernel_operator
    kernel_operator.attach_grid_preconditioner = lambda added: added
reuse = lazykern.settings.preconditioner_reuse(10 if setting == "grid-reused" else 1)
with lazykern.settings.engine(spec["engine"]), gpytorch.settings.fast_computations(), \
        gpytorch.settings.skip_posterior_variances(), gpytorch.settings.memory_efficient(), reuse:
    start = time.perf_counter()
    for _ in range(spec["steps"]):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
hyper = {"noise": model.likelihood.noise, "outputscale": model.covar.outputscale,
         "lengthscale": model.covar.base_kernel.base_kernel.lengthscale}
print("RESULT", json.dumps({"seconds": seconds, "losses": losses, "n": x.shape[0],
                            "constant": model.mean.constant.item(),
                            "state": {k: v.detach().flatten().tolist() for k, v in hyper.items()}}))
"""


def _data_dir(given: Path | None) -> str:
    for candidate in (given, os.environ.get("LAZYKERN_DATA"), ROOT.parent / "shared" / "uci"):
        if candidate and (Path(candidate) / "pol").is_dir():
            return str(candidate)
    raise SystemExit("benchmarks/gpytorch748_loop.py: no pol/ under --data-dir, $LAZYKERN_DATA or ../shared/uci")


def run(spec: dict) -> dict:
    """One loop in a fresh subprocess: ``spec`` holds family, engine, steps, data_dir and optionally
    ``setting`` (``"grid"``: the grid preconditioner built every step, the default;
    ``"grid-reused"``: kept for ten steps; ``"pivoted-cholesky"``: ``linear_operator``'s default)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                          env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    return next((json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")),
                {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["matern", "rbf"])
    parser.add_argument("--engines", nargs="+", default=["structured", "cpu"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpytorch748-loop")
    args = parser.parse_args()
    data_dir = _data_dir(args.data_dir)
    records = []
    for family in args.families:
        for engine in args.engines:
            spec = {"family": family, "engine": engine, "steps": args.steps, "data_dir": data_dir}
            records.append({**spec, **run(spec)})
            print(json.dumps({k: v for k, v in records[-1].items() if k != "state"}), flush=True)
    from lazykern.cache_paths import cpu_model

    meta = {"machine": cpu_model(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
    lines = [f"# GPyTorch #748's loop on pol ({meta['date']}, {meta['cores']} cores)", "",
             f"`{meta['command']}`: {args.steps} SGD steps, lr 0.1, fast_computations, float32.", "",
             "| kernel | engine | N | seconds | first loss | last loss | trained noise, output scale, lengthscales against the pair engine |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['family']} | {r['engine']} | - | {r['error']} | | | |")
            continue
        peer = next((p for p in records if p["family"] == r["family"] and p["engine"] == "cpu" and "state" in p), None)
        diff = "-"
        if peer is not None and peer is not r:
            worst = max(abs(a - b) / abs(b) for k in r["state"] for a, b in zip(r["state"][k], peer["state"][k]))
            diff = f"{worst:.1e} relative, mean {abs(r['constant'] - peer['constant']):.1e} absolute"
        lines.append(f"| {r['family']} | {r['engine']} | {r['n']:,} | {r['seconds']:.1f} | {r['losses'][0]:.4f} | "
                     f"{r['losses'][-1]:.4f} | {diff} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
