"""What each phase of the large-N recipe buys: test RMSE after the subset's exact fit and every few
Adam steps on all training points.

Runs the phases of :data:`lazykern.regression.recipe.LARGE_N` by hand on one UCI split: the ARD fit
and the subset's exact fit (:func:`lazykern.regression.prepare`, :func:`lazykern.regression.warm_start`),
then Adam on all points with the recipe's settings (:class:`lazykern.regression.ExactMLL`, conjugate
gradients to 0.01 with the grid preconditioner, float64), predicting the test set after the subset's
fit and every ``--every`` steps (the mean's weights solved to the recipe's 1e-8). One continuous Adam
run, as the recipe's, so the RMSE at step k is that of the recipe with ``--iters k``.

Usage::

    python benchmarks/large_n_trajectory.py kin40k --steps 150
    python benchmarks/large_n_trajectory.py pol --projections 208 --warm-start-iters 150

Data: ``--data-dir``, else ``$LAZYKERN_DATA``, else ``../shared/uci``. Appends one JSON record to
``benchmarks/results/large-n-trajectory.jsonl``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--projections", type=int, default=None, help="J (default: the recipe's, min(8d, 128))")
    parser.add_argument("--warm-start-iters", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="Adam steps on all points (default: the recipe's)")
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()

    import gpytorch
    import linear_operator
    import torch

    from lazykern.data import load_uci
    from lazykern.kernel_names import LARGE_N_KERNEL, large_n_num_projections
    from lazykern.regression import LARGE_N, ExactMLL, predict, prepare, to_float64, warm_start

    torch.set_num_threads(args.threads)
    data_dir = args.data_dir or os.environ.get("LAZYKERN_DATA") or str(ROOT.parent / "shared" / "uci")
    data = load_uci(args.dataset, args.split, data_dir=data_dir, dtype=torch.float64)
    changes = {k: v for k, v in (("warm_start_iters", args.warm_start_iters), ("iters", args.steps),
                                 ("lr", args.lr)) if v is not None}
    recipe = dataclasses.replace(LARGE_N, **changes)
    projections = args.projections or large_n_num_projections(data.d)
    start = time.perf_counter()
    model, likelihood, prepared = prepare(data.train_x, data.train_y, LARGE_N_KERNEL, recipe,
                                          num_projections=projections, progress=False)
    warm_start(model, likelihood, recipe.warm_start_size, iters=recipe.warm_start_budget, progress=False)
    trace = []

    def record(step: int) -> None:
        with gpytorch.settings.max_cholesky_size(recipe.max_cholesky_size), \
                gpytorch.settings.eval_cg_tolerance(recipe.solve_tolerance):
            mean, _ = predict(model, likelihood, data.test_x)
        rmse = float((mean - data.test_y).square().mean().sqrt())
        trace.append({"step": step, "rmse": rmse, "noise": likelihood.noise.item(),
                      "seconds": time.perf_counter() - start})
        print(json.dumps(trace[-1]), flush=True)
        model.train(), likelihood.train()

    record(0)
    to_float64(model)
    mll = ExactMLL(likelihood, model)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=recipe.lr)
    with gpytorch.settings.max_cholesky_size(recipe.max_cholesky_size), \
            linear_operator.settings.cg_tolerance(recipe.cg_tolerance):
        for step in range(1, recipe.iters + 1):
            optimizer.zero_grad()
            (-mll(model(*model.train_inputs), model.train_targets)).backward()
            optimizer.step()
            if step % args.every == 0 or step == recipe.iters:
                record(step)
    RESULTS.mkdir(exist_ok=True)
    entry = {"dataset": args.dataset, "split": args.split, "n_train": data.n_train, "projections": projections,
             "recipe": {k: str(v) for k, v in dataclasses.asdict(recipe).items()}, "trace": trace,
             "date": time.strftime("%Y-%m-%d", time.gmtime()), "threads": args.threads}
    with open(RESULTS / "large-n-trajectory.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


if __name__ == "__main__":
    main()
