"""Whether Newton–Girard's full-pol gap to ARD is the model's or the optimizer's.

Sets the Newton–Girard kernel over all orders to the ARD RBF run's trained hyperparameters (the top
order, the ARD product, carries ARD's outputscale; every lower order a variance of 1e-6), then
evaluates the training loss and the test metrics with the settings of ``uci_results.py --full``
(split 0, float32, conjugate gradients above 2000 points). Takes the first ``rbf-ard`` full-set record
in ``results/uci.jsonl`` (the 200-step run the docs cite); the data come from ``LAZYKERN_DATA`` (or
``--data-dir``).

    LAZYKERN_DATA=../shared/uci python3 benchmarks/uci_ng_at_ard.py
"""

from __future__ import annotations

import argparse
import json

import gpytorch
import torch
from uci_results import load_records

from lazykern.data import load_uci
from lazykern.regression import build_model, gaussian_metrics, predict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="pol")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    ard = next(r for r in load_records() if r["full"] and r["kernel"] == "rbf-ard" and r["dataset"] == args.dataset
               and "error" not in r)["hyperparameters"]
    torch.manual_seed(0)
    torch.set_flush_denormal(True)
    data = load_uci(args.dataset, split=0, n_train=None, seed=0, dtype=torch.float32, data_dir=args.data_dir)
    model, likelihood = build_model(data.train_x, data.train_y, "additive-ng")
    covar = model.covar_module
    with torch.no_grad():
        covar.base_kernel.lengthscale = torch.tensor(ard["covar_module.base_kernel.lengthscale"]).view_as(
            covar.base_kernel.lengthscale)
        scales = torch.full_like(covar.outputscale, 1e-6)
        scales[-1] = ard["covar_module.outputscale"]
        covar.outputscale = scales
        likelihood.noise = ard["likelihood.noise_covar.noise"]
        model.mean_module.constant.fill_(ard["mean_module.constant"])
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    likelihood.train()
    with gpytorch.settings.max_cholesky_size(2000):
        with torch.no_grad():
            loss = -mll(model(data.train_x), data.train_y).item()
        mean, variance = predict(model, likelihood, data.test_x)
    rmse, nlpd = gaussian_metrics(mean, variance, data.test_y)
    print(json.dumps({"dataset": args.dataset, "kernel": "additive-ng at rbf-ard's hyperparameters",
                      "training_loss": loss, "rmse": rmse, "nlpd": nlpd}))


if __name__ == "__main__":
    main()
