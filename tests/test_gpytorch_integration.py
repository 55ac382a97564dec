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


# ------------------------------------------------------------------ the production training path vs GPyTorch
class _BatchGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, covar):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([2])))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=torch.Size([2]))
        self.covar_module = covar

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _cg_path_models(x, y, d):
    """lazykern's and GPyTorch's kernels for
    k = o_1 sum_d s_d RQ(x_d, x'_d) + o_2 sum_d Periodic(x_d, x'_d), a batch of 2, equal hyperparameters.

    GPyTorch has no per-dimension scales in its AdditiveStructureKernel, so its RQ part is an
    AdditiveKernel of per-dimension ScaleKernel(RQKernel(active_dims=[d])) (the shared alpha of
    lazykern's base becomes d tied copies)."""
    batch = torch.Size([2])
    scale = lambda k: gpytorch.kernels.ScaleKernel(k, batch_shape=batch)  # noqa: E731
    rq = lazykern.RQKernel(ard_num_dims=d, batch_shape=batch)
    periodic = lazykern.PeriodicKernel(ard_num_dims=d, batch_shape=batch)
    ours = _BatchGP(
        x, y,
        scale(lazykern.AdditiveStructureKernel(rq, num_dims=d, component_scales=True))
        + scale(lazykern.AdditiveStructureKernel(periodic, num_dims=d)),
    ).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # GPyTorch deprecates its additive kernel
        theirs = _BatchGP(
            x, y,
            scale(gpytorch.kernels.AdditiveKernel(
                *[scale(gpytorch.kernels.RQKernel(batch_shape=batch, active_dims=[i])) for i in range(d)]
            ))
            + scale(gpytorch.kernels.AdditiveStructureKernel(
                gpytorch.kernels.PeriodicKernel(ard_num_dims=d, batch_shape=batch), num_dims=d
            )),
        ).double()
    gen = torch.Generator().manual_seed(5)
    values = lambda *shape: 0.6 + torch.rand(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    small = lambda *shape: 0.2 + 0.3 * torch.rand(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    rq_ours, per_ours = ours.covar_module.kernels[0], ours.covar_module.kernels[1]
    rq_theirs, per_theirs = theirs.covar_module.kernels[0], theirs.covar_module.kernels[1]
    for model in (ours, theirs):
        model.likelihood.noise = torch.tensor([[0.8], [1.0]], dtype=torch.float64)
        model.mean_module.constant = torch.tensor([0.1, -0.2], dtype=torch.float64)
    # Small output scales against the noise keep K + noise well conditioned: CG converges to the
    # tightened tolerance in few iterations, so both models run to the same solution.
    rq_ours.outputscale = rq_theirs.outputscale = small(2)
    per_ours.outputscale = per_theirs.outputscale = small(2)
    rq_ours.base_kernel.component_scales = values(2, 1, d)
    rq_ours.base_kernel.base_kernel.lengthscale = values(2, 1, d)
    rq_ours.base_kernel.base_kernel.alpha = values(2, 1)
    for i, k in enumerate(rq_theirs.base_kernel.kernels):
        k.outputscale = rq_ours.base_kernel.component_scales[:, 0, i]
        k.base_kernel.lengthscale = rq_ours.base_kernel.base_kernel.lengthscale[..., i : i + 1]
        k.base_kernel.alpha = rq_ours.base_kernel.base_kernel.alpha
    per_ours.base_kernel.base_kernel.lengthscale = per_theirs.base_kernel.base_kernel.lengthscale = values(2, 1, d)
    period = values(2, 1, d) + 0.5
    per_ours.base_kernel.base_kernel.period_length = per_theirs.base_kernel.base_kernel.period_length = period

    def their_grad(name, grads):
        """GPyTorch's gradient for our parameter ``name`` (tied copies summed)."""
        rq_parts = [f"covar_module.kernels.0.base_kernel.kernels.{i}" for i in range(d)]
        if name == "covar_module.kernels.0.base_kernel.raw_component_scales":
            return torch.stack([grads[f"{p}.raw_outputscale"] for p in rq_parts], -1).unsqueeze(-2)
        if name == "covar_module.kernels.0.base_kernel.base_kernel.raw_lengthscale":
            return torch.cat([grads[f"{p}.base_kernel.raw_lengthscale"] for p in rq_parts], -1)
        if name == "covar_module.kernels.0.base_kernel.base_kernel.raw_alpha":
            return sum(grads[f"{p}.base_kernel.raw_alpha"] for p in rq_parts)
        return grads[name]

    return ours, theirs, their_grad


@pytest.mark.slow
def test_one_cg_training_step_and_predictions_equal_gpytorch_dense_kernels(monkeypatch):
    """N = 3000, float64, max_cholesky_size=0 (CG + Lanczos), a batch of 2: one
    training step of lazykern's production path (one merged KeOps formula, fused gradient, dense
    cache) gives GPyTorch's loss, every hyperparameter gradient and the predictive mean and
    variance, to 1e-6 relative with CG tolerances tightened."""
    from lazykern import backend

    fused = []
    gradients = backend.symmetric_gradients
    monkeypatch.setattr(backend, "symmetric_gradients", lambda *a: fused.append(1) or gradients(*a))
    n, d = 3000, 2
    gen = torch.Generator().manual_seed(11)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64) * 4
    y = torch.stack([torch.sin(2 * x).sum(-1), torch.cos(x).prod(-1)])
    y = y + 0.1 * torch.randn(2, n, generator=gen, dtype=torch.float64)
    x_test = torch.rand(8, d, generator=gen, dtype=torch.float64) * 4
    ours, theirs, their_grad = _cg_path_models(x, y, d)
    results = []
    for model in (ours, theirs):
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        model.train()
        torch.manual_seed(0)  # the same Lanczos probe vectors for both
        # Tightened CG tolerances; both models stop at the same iteration cap (the rank-15
        # preconditioned CG of GPyTorch stalls near 1e-6 relative residual on this problem), so
        # they run the same algorithm on matrices equal to rounding.
        with (
            gpytorch.settings.max_cholesky_size(0),
            gpytorch.settings.cg_tolerance(1e-10),
            gpytorch.settings.eval_cg_tolerance(1e-10),
            gpytorch.settings.max_cg_iterations(60),
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", message="CG terminated")
            warnings.simplefilter("ignore", DeprecationWarning)  # GPyTorch's additive kernel
            loss = -mll(model(x), y).sum()
            names, params = zip(*model.named_parameters())
            grads = dict(zip(names, torch.autograd.grad(loss, params)))
            model.eval()
            with torch.no_grad():
                pred = model.likelihood(model(x_test))
                mean, var = pred.mean, pred.variance
        results.append((loss.detach(), grads, mean, var))
    (loss, grads, mean, var), (loss_g, grads_g, mean_g, var_g) = results
    assert fused, "the fused KeOps gradient did not run"
    assert type(ours.covar_module(x).evaluate_kernel()).__name__ == "LazyKernelOperator"  # one formula

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))

    assert rel(loss, loss_g) <= 1e-6, (loss, loss_g)
    for name, g in grads.items():
        assert rel(g, their_grad(name, grads_g)) <= 1e-6, name
    assert rel(mean, mean_g) <= 1e-6
    assert rel(var, var_g) <= 1e-6
