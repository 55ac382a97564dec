"""Exact GP regression on a UCI dataset with a lazy additive kernel: the model to copy.

    python3 examples/uci_regression.py [DATASET] [--n-train N] [--iters N] [--out FOLDER]

The kernel is a sum over input dimensions of one-dimensional RBF kernels, each with its own
lengthscale and weight, evaluated as one lazy formula (never a d x n x n tensor). It prints the
test RMSE and NLPD next to the mean predictor's, the inputs ranked by total effect (printed by
:func:`lazykern.components.report_lines`, as ``lazykern uci`` prints them), and writes the test
predictions in original units (target, mean, standard deviation) to FOLDER/uci_regression_DATASET.csv.
The data are float32; once L-BFGS has converged, :func:`lazykern.regression.train` moves the model to
float64 and refines it there (float32 rounding ends line searches early), so it predicts in float64.

Data: --data-dir, else $LAZYKERN_DATA, else downloaded once (checksum-verified) into
~/.cache/lazykern/uci; DATASET "synthetic" needs no data.
"""

import lazykern  # noqa: I001 - first: it hides a dependency's import-time notice (lazykern/__init__.py)

import gpytorch
import numpy as np
import torch

from _common import load, output, training_parser
from lazykern.components import component_analysis, report_lines, summary
from lazykern.regression import ExactGPRegressor, gaussian_metrics, predict, train

args = training_parser(__doc__).parse_args()

# Standardized with training statistics: the mean predictor has RMSE 1 (up to sampling).
data = load(args.dataset, n_train=args.n_train, dtype=torch.float32, data_dir=args.data_dir)

kernel = gpytorch.kernels.ScaleKernel(
    lazykern.kernels.AdditiveStructureKernel(
        lazykern.kernels.RBFKernel(ard_num_dims=data.d), num_dims=data.d, component_scales=True
    )
)
likelihood = gpytorch.likelihoods.GaussianLikelihood()
model = ExactGPRegressor(data.train_x, data.train_y, likelihood, kernel)

# Up to 2000 points an exact Cholesky solve is cheapest; above it GPyTorch switches to conjugate
# gradients, whose matvecs are the lazy reductions.
with gpytorch.settings.max_cholesky_size(2000):
    train(model, likelihood, iters=args.iters)  # the recipe of lazykern.regression.train; progress on stderr
    mean, variance = predict(model, likelihood, data.test_x)

rmse, nlpd = gaussian_metrics(mean, variance, data.test_y)
base_rmse, base_nlpd = gaussian_metrics(torch.zeros_like(data.test_y), torch.ones_like(data.test_y), data.test_y)
print(f"{data.name}: n_train={data.n_train}, n_test={data.n_test}, d={data.d}")
print(f"test RMSE {rmse:.4f} (original units {rmse * data.y_std:.4g}), NLPD {nlpd:.4f}")
print(f"mean predictor: RMSE {base_rmse:.4f}, NLPD {base_nlpd:.4f} (standardized units)")
# The command's analysis and report: total effects, not raw component weights (a weight says
# nothing of how much an input's component varies over the data).
# (variance_max_n=0: no component bands, so no dense factor; the mean solve is the one predict cached.)
print("\n".join(report_lines(summary(component_analysis(model, variance_max_n=0)))))

path = output(args.out, f"uci_regression_{data.name}.csv")
columns = [data.y_to_original(data.test_y), data.y_to_original(mean), variance.sqrt() * data.y_std]
np.savetxt(path, torch.stack(columns, -1).numpy(), delimiter=",", header="y,mean,std", comments="", fmt="%.6g")
print(f"wrote {path}")
