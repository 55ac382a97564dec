"""Exact GP regression on a UCI dataset with a lazy additive kernel: the model to copy.

    LAZYKERN_DATA=/path/to/uci_datasets python examples/uci_regression.py [DATASET]

The kernel is a sum over input dimensions of one-dimensional RBF kernels, each with its own
lengthscale and weight, evaluated as one KeOps formula (never a d x n x n tensor). Without
LAZYKERN_DATA the dataset is downloaded (checksum-verified) into ~/.cache/lazykern/uci.
"""

import sys

import gpytorch
import torch

import lazykern
from lazykern.data import load_uci
from lazykern.regression import ExactGPRegressor, gaussian_metrics, predict, train

name = sys.argv[1] if len(sys.argv) > 1 else "pol"
data = load_uci(name, split=0, n_train=2000, dtype=torch.float32)  # standardized with training statistics
kernel = gpytorch.kernels.ScaleKernel(
    lazykern.kernels.AdditiveStructureKernel(
        lazykern.kernels.RBFKernel(ard_num_dims=data.d), num_dims=data.d, component_scales=True
    )
)
likelihood = gpytorch.likelihoods.GaussianLikelihood()
model = ExactGPRegressor(data.train_x, data.train_y, likelihood, kernel)

# 2000 points: an exact Cholesky solve is cheapest; above it GPyTorch switches to conjugate
# gradients, whose matvecs are the lazy KeOps reductions.
with gpytorch.settings.max_cholesky_size(2000):
    train(model, likelihood, iters=50, lr=0.1)
    mean, variance = predict(model, likelihood, data.test_x)

rmse, nlpd = gaussian_metrics(mean, variance, data.test_y)
print(f"{name}: n_train={data.n_train}, n_test={data.n_test}, d={data.d}")
print(f"test RMSE {rmse:.4f} (original units {rmse * data.y_std:.4g}), NLPD {nlpd:.4f}")
weights = kernel.base_kernel.component_scales.detach().flatten()
print("most relevant inputs:", weights.argsort(descending=True)[:5].tolist())
