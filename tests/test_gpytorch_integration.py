"""lazykern kernels inside GPyTorch models: exact MLL against GPyTorch, CG training and prediction."""

from __future__ import annotations

import copy
import warnings

import gpytorch
import pytest
import torch

import lazykern
from lazykern import settings


class ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, kernel):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _mll_and_grads(model, x, y):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    loss = mll(model(x), y)
    names, params = zip(*model.named_parameters())
    return loss, dict(zip(names, torch.autograd.grad(loss, params)))


@pytest.mark.parametrize(
    "make_base",
    [
        lambda d: gpytorch.kernels.RBFKernel(ard_num_dims=d),
        lambda d: gpytorch.kernels.MaternKernel(nu=2.5),
        lambda d: gpytorch.kernels.PeriodicKernel(ard_num_dims=d),
    ],
    ids=["rbf-ard", "matern52-shared", "periodic-ard"],
)
def test_exact_mll_matches_gpytorch_additive_structure_kernel(make_base):
    n, d = 300, 5
    x = torch.rand(n, d, dtype=torch.float64)
    y = torch.sin(6 * x).sum(-1) + 0.1 * torch.randn(n, dtype=torch.float64)
    base = make_base(d).double()
    base.lengthscale = torch.linspace(0.3, 0.9, base.lengthscale.shape[-1], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # GPyTorch deprecates its additive kernel
        theirs = ExactGP(x, y, gpytorch.kernels.AdditiveStructureKernel(copy.deepcopy(base), num_dims=d)).double()
    ours = ExactGP(x, y, lazykern.AdditiveStructureKernel(copy.deepcopy(base), num_dims=d)).double()
    with gpytorch.settings.fast_computations(log_prob=False, covar_root_decomposition=False, solves=False):
        loss_ours, grads_ours = _mll_and_grads(ours, x, y)
        loss_theirs, grads_theirs = _mll_and_grads(theirs, x, y)
    assert abs(loss_ours - loss_theirs) <= 1e-10 * abs(loss_theirs)
    assert grads_ours.keys() == grads_theirs.keys()
    for name, g in grads_theirs.items():
        err = (grads_ours[name] - g).abs().max() / g.abs().max().clamp_min(1e-300)
        assert err <= 1e-10, f"{name}: relative error {err:.2e}"


def _additive_data(n, d, generator):
    x = torch.rand(n, d, generator=generator) * 2 - 1
    f = torch.sin(3 * x).sum(-1) + x[:, 0] ** 2
    return x, f + 0.05 * torch.randn(n, generator=generator)


def test_exact_gp_trains_on_cg_path_and_predicts():
    """N=3000 > max_cholesky_size: CG with GPyTorch's default pivoted-Cholesky preconditioner,
    then mean and variance for 500 test points with fast_pred_var, all on the lazy (KeOps) path."""
    generator = torch.Generator().manual_seed(0)
    d = 4
    x, y = _additive_data(3000, d, generator)
    x_test, y_test = _additive_data(500, d, generator)
    base = lazykern.RBFKernel(ard_num_dims=d)
    model = ExactGP(x, y, lazykern.AdditiveStructureKernel(base, num_dims=d, component_scales=True))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    losses = []
    with settings.max_dense_bytes(0), gpytorch.settings.max_cg_iterations(200):
        model.train()
        for _ in range(6):
            optimizer.zero_grad()
            loss = -mll(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        model.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var():
            pred = model.likelihood(model(x_test))
            mean, var = pred.mean, pred.variance
    assert losses[-1] < losses[0]
    assert mean.shape == var.shape == (500,)
    assert torch.isfinite(var).all() and (var > 0).all()
    rmse = (mean - y_test).pow(2).mean().sqrt()
    assert rmse < 0.5 * y_test.std()


@pytest.mark.parametrize("max_cholesky_size", [0, 1])
def test_pivoted_cholesky_preconditioner_with_any_max_cholesky_size(max_cholesky_size):
    """GPyTorch's own KeOps kernels fail here (1-row blocks become LazyTensors); ours gathers entries."""
    generator = torch.Generator().manual_seed(1)
    x, y = _additive_data(2100, 3, generator)  # > min_preconditioning_size (2000)
    model = ExactGP(x, y, lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=3)).double()
    x, y = x.double(), y.double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    with (
        settings.max_dense_bytes(0),
        gpytorch.settings.max_cholesky_size(max_cholesky_size),
        gpytorch.settings.max_cg_iterations(30),
    ):
        loss = -mll(model(x), y)
        loss.backward()
    assert torch.isfinite(loss)
