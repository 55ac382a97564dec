"""The grid preconditioner of additive kernels (lazykern.structured.grid) and its place on
linear_operator's path (lazykern.operators.preconditioning), against dense references in float64.

P is checked against the matrix written from its definition (interpolation weights times the grid's
Gram matrix); its solve, log-determinant and products to 1e-10. Through GPyTorch: the
preconditioned CG solve equals a dense solve, the SLQ marginal log likelihood matches Cholesky's
within its stochastic error, and CG needs fewer kernel products than without it.
"""

from __future__ import annotations

import gpytorch
import pytest
import torch
from linear_operator import settings as lo_settings

import lazykern
from lazykern.formulas import StationaryFormula
from lazykern.operators import GridPreconditionerOperator, LazyKernelOperator
from lazykern.regression import build_model
from lazykern.solvers import cg
from lazykern.structured import grid as grid_module
from lazykern.structured.grid import AdditiveGrid, cubic_weights

F64 = torch.float64
KERNELS = [StationaryFormula("matern", nu=0.5), StationaryFormula("matern", nu=1.5),
           StationaryFormula("matern", nu=2.5), StationaryFormula("rbf")]


def interpolation_matrix(grid: AdditiveGrid, d: int) -> torch.Tensor:
    """W_d, the columns of dimension d of the grid's sparse interpolation matrix."""
    start = sum(r.shape[0] for r in grid.roots[:d])
    return grid._interpolate.to_dense()[:, start:start + grid.roots[d].shape[0]]


@pytest.fixture(scope="module")
def points():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(300, 3, generator=g, dtype=F64) * torch.tensor([8.0, 1.0, 30.0], dtype=F64)
    x[:20] = x[20:40]  # duplicated points
    noise = torch.rand(300, generator=g, dtype=F64) * 0.1 + 0.01
    return x, torch.tensor([0.5, 1.0, 2.0], dtype=F64), noise


def test_cubic_weights_reproduce_quadratics():
    u = torch.linspace(1.0, 7.0, 41, dtype=F64)
    w = cubic_weights(u)
    nodes = torch.floor(u)[:, None] + torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=F64)
    for q in (lambda t: torch.ones_like(t), lambda t: t, lambda t: t * t - 3 * t):
        assert torch.allclose((w * q(nodes)).sum(-1), q(u), atol=1e-13)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: f"{k.family}{k.nu or ''}")
def test_grid_is_exact_for_its_matrix(points, kernel, monkeypatch):
    x, scales, noise = points
    monkeypatch.setattr(grid_module, "KEPT_FRACTION", 0.0)  # every non-negative eigenvalue kept
    grid = AdditiveGrid(kernel, x, scales, noise)
    reference = torch.diag(noise)
    for d in range(3):
        W = interpolation_matrix(grid, d)
        # the grid: evenly spaced from the column's smallest to largest value, one node below
        h = float(x[:, d].max() - x[:, d].min()) / (W.shape[1] - 4)
        nodes = float(x[:, d].min()) + h * (torch.arange(W.shape[1], dtype=F64) - 1)
        assert torch.allclose(W @ nodes, x[:, d], atol=1e-10)  # interpolation of the identity
        gram = kernel(nodes[:, None, None], nodes[None, :, None]).squeeze(-1) * scales[d]
        reference += W @ gram @ W.T
    P = grid.dense()
    assert torch.allclose(P, reference, atol=1e-10 * float(reference.abs().max()))
    v = torch.randn(300, 2, dtype=F64)
    exact = torch.linalg.solve(P, v)
    assert float((grid.solve(v) - exact).abs().max()) <= 1e-10 * float(exact.abs().max())
    assert abs(grid.logdet - float(torch.logdet(P))) <= 1e-10 * abs(float(torch.logdet(P)))
    assert grid.sample(4).shape == (300, 4)
    assert torch.allclose(grid.diagonal(), reference.diagonal(), atol=1e-10 * float(reference.abs().max()))


def test_grid_rejects_a_non_positive_noise(points):
    x, scales, noise = points
    with pytest.raises(ValueError, match="noise must be positive"):
        AdditiveGrid(KERNELS[2], x, scales, noise - 1.0)


def additive(nu: float | None, dims: int = 3) -> gpytorch.kernels.Kernel:
    base = lazykern.RBFKernel() if nu is None else lazykern.MaternKernel(nu=nu)
    kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=dims, component_scales=True))
    kernel.base_kernel.component_scales = torch.tensor([[0.2, 0.5, 1.0]])
    return kernel.double()


@pytest.mark.parametrize("nu", [2.5, None], ids=["matern2.5", "rbf"])
def test_preconditioned_cg_equals_a_dense_solve(nu):
    x = torch.rand(300, 3, dtype=F64) * 4
    with torch.no_grad(), lo_settings.min_preconditioning_size(0):
        A = additive(nu)(x).evaluate_kernel().add_diagonal(torch.tensor(0.01, dtype=F64))
        closure, P, logdet = A._preconditioner()
        assert isinstance(P, GridPreconditionerOperator)
        b = torch.randn(300, 2, dtype=F64)
        columns = A @ torch.eye(300, dtype=F64)  # A's columns by the structured engine, for the CG runs
        dense = torch.linalg.solve(columns, b)
        X, pre = cg(columns, b, precond=closure, tol=1e-11)
        _, plain = cg(columns, b, tol=1e-11)
    assert float((X - dense).abs().max()) <= 1e-9 * float(dense.abs().max())
    assert pre.iterations * 5 <= plain.iterations


def test_fallbacks_keep_linear_operators_default():
    x = torch.rand(300, 3, dtype=F64)
    noise = torch.tensor(0.1, dtype=F64)
    assert lazykern.RBFKernel().double()(x).evaluate_kernel().add_diagonal(noise).preconditioner_override is None
    batch = additive(2.5)
    batch.outputscale = torch.ones(())
    K = LazyKernelOperator(x.expand(2, 300, 3), x.expand(2, 300, 3),
                           covar_func=StationaryFormula("matern", additive=True, nu=2.5), scales=torch.ones(2, 1, 3))
    assert K.add_diagonal(noise).preconditioner_override is None
    with lo_settings.max_preconditioner_size(0), lo_settings.min_preconditioning_size(0):
        assert additive(2.5)(x).evaluate_kernel().add_diagonal(noise)._preconditioner() == (None, None, None)


def test_first_order_interaction_kernels_take_their_terms_from_the_engine():
    """A first-order Newton-Girard kernel is interpolated with its order variance and the first
    order's 1/D; OAK, which the structured engine does not take, is not."""
    x = torch.rand(300, 3, dtype=F64)
    ng = lazykern.NewtonGirardAdditiveKernel(lazykern.MaternKernel(nu=1.5, ard_num_dims=3), num_dims=3, max_degree=1)
    ng = gpytorch.kernels.ScaleKernel(ng).double()
    ng.base_kernel.outputscale, ng.outputscale = 3.0, 2.0
    op = ng(x).evaluate_kernel()
    one, scales = grid_module.additive_terms(op.covar_func, op.x1, op.tensor_params)
    assert one == StationaryFormula("matern", nu=1.5)
    assert torch.allclose(scales, torch.full((1, 3), 2.0 * 3.0 / 3, dtype=F64))
    oak = lazykern.OrthogonalAdditiveKernel(num_dims=3, max_degree=1).double()(x).evaluate_kernel()
    assert grid_module.additive_terms(oak.covar_func, oak.x1, oak.tensor_params) is None


def test_float32_operator_gets_a_float32_preconditioner():
    x = torch.rand(300, 3)
    with torch.no_grad(), lo_settings.min_preconditioning_size(0):
        A = additive(1.5).float()(x).evaluate_kernel().add_diagonal(torch.tensor(0.05))
        closure, P, logdet = A._preconditioner()
        z = closure(A @ torch.ones(300, 1))
    assert z.dtype == torch.float32 and P.zero_mean_mvn_samples(3).dtype == torch.float32
    assert float((z - 1).abs().max()) < 0.3  # P close to A: P^{-1} A 1 close to 1


def test_mll_by_slq_matches_cholesky_with_fewer_products(monkeypatch):
    torch.manual_seed(0)
    x = torch.rand(300, 3, dtype=F64) * 4
    y = torch.sin(2 * x).sum(-1) + 0.1 * torch.randn(300, dtype=F64)
    model, likelihood = build_model(x, y, additive(2.5))
    likelihood.noise = 0.01
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**4):
        exact = float(mll(model(x), y))
    products = []
    matmul = LazyKernelOperator._matmul
    monkeypatch.setattr(LazyKernelOperator, "_matmul", lambda self, rhs: products.append(1) or matmul(self, rhs))
    counts = {}
    for size in (15, 0):  # linear_operator's switch: 0 turns preconditioning off
        products.clear()
        with torch.no_grad(), gpytorch.settings.max_cholesky_size(0), lo_settings.min_preconditioning_size(0), \
                lo_settings.max_preconditioner_size(size), gpytorch.settings.cg_tolerance(1e-2):
            value = float(mll(model(x), y))
        counts[size] = len(products)
        if size:
            # SLQ's error per point, with the probes of N(0, P): measured 1e-4 at this size
            assert abs(value - exact) < 2e-3
    assert counts[15] * 2 <= counts[0]  # measured 22 against 63


def test_predictions_form_no_train_by_test_matrix(monkeypatch):
    """Posterior mean and LOVE variances: every kernel product is a lazy pass, nothing M x N is formed."""
    x, xs = torch.rand(300, 3, dtype=F64) * 4, torch.rand(200, 3, dtype=F64) * 4
    model, likelihood = build_model(x, torch.sin(x).sum(-1), additive(2.5))
    model.eval()
    formed = []
    dense = lazykern.backend.pairwise_dense
    monkeypatch.setattr(lazykern.backend, "pairwise_dense",
                        lambda formula, x1, x2, *a, **k: formed.append((x1.shape[-2], x2.shape[-2])) or dense(formula, x1, x2, *a, **k))
    # GPyTorch forms both test covariances densely up to max_eager_kernel_size points together
    with torch.no_grad(), gpytorch.settings.fast_pred_var(), gpytorch.settings.max_cholesky_size(0), \
            gpytorch.settings.max_eager_kernel_size(0), lazykern.settings.max_dense_bytes(0):
        posterior = likelihood(model(xs))
        mean, variance = posterior.mean, posterior.variance
    assert [shape for shape in formed if shape[0] > 1 and shape[1] > 1] == []
    assert mean.shape == variance.shape == (200,) and bool((variance > 0).all())


def test_rank_limit(points):
    x, scales, noise = points
    grid = AdditiveGrid(KERNELS[0], x, scales, noise, max_rank=40)
    v = torch.randn(300, 2, dtype=F64)
    assert grid.rank <= 40 and torch.allclose(grid.matmul(grid.solve(v)), v, atol=1e-10)  # still exact for its P


def test_projected_kernels_of_many_terms_get_the_grid():
    """A sum of 96 one-dimensional terms (a projected kernel, J = 12 d): the grid on
    linear_operator's path, solves to 1e-6 in a few iterations where CG alone needs many."""
    x = torch.randn(1500, 8, dtype=F64)
    kernel = lazykern.ProjectedAdditiveKernel(lazykern.MaternKernel(nu=2.5), 8, 96).double()
    with torch.no_grad(), lo_settings.min_preconditioning_size(0):
        A = kernel(x).evaluate_kernel().add_diagonal(torch.tensor(0.01, dtype=F64))
        closure, P, _ = A._preconditioner()
        assert isinstance(P, GridPreconditionerOperator)
        b = torch.randn(1500, 2, dtype=F64)
        _, pre = cg(A, b, precond=closure, tol=1e-6)
        _, plain = cg(A, b, tol=1e-6)
    assert bool(pre.converged.all()) and pre.iterations * 10 <= plain.iterations


def test_reuse_serves_that_many_operators_then_builds_again(points):
    x = torch.rand(600, 3, dtype=F64)
    kernel = additive(2.5)
    built = []
    with torch.no_grad(), lo_settings.min_preconditioning_size(0), lazykern.settings.preconditioner_reuse(3):
        for _ in range(7):
            A = kernel(x).evaluate_kernel().add_diagonal(torch.tensor(0.01, dtype=F64))
            built.append(A._preconditioner()[1].grid)
    assert [len({id(g) for g in built[:k]}) for k in (3, 4, 6, 7)] == [1, 2, 2, 3]
    with torch.no_grad(), lo_settings.min_preconditioning_size(0):  # outside the context: one each
        grids = [kernel(x).evaluate_kernel().add_diagonal(torch.tensor(0.01, dtype=F64))._preconditioner()[1].grid
                 for _ in range(2)]
    assert grids[0] is not grids[1]


@pytest.mark.parametrize("kernel", KERNELS[2:], ids=lambda k: f"{k.family}{k.nu or ''}")
def test_posterior_variance_of_the_grid_model(points, kernel, monkeypatch):
    """Against the variance of the grid's model written densely: the prior P - D, points beyond
    the training inputs included (the grids span ``extent``)."""
    x, scales, noise = points
    new = torch.rand(25, 3, dtype=F64) * torch.tensor([10.0, 1.2, 34.0], dtype=F64) - 1.0
    monkeypatch.setattr(grid_module, "KEPT_FRACTION", 0.0)
    grid = AdditiveGrid(kernel, x, scales, noise, extent=new)
    both = AdditiveGrid(kernel, torch.cat([x, new]), scales, torch.cat([noise, torch.ones(25, dtype=F64)]))
    prior = both.dense() - torch.diag(both.noise)          # Phi Phi^T over the points and the new ones
    cross, own = prior[300:, :300], prior[300:, 300:].diagonal()
    exact = own - (cross * torch.linalg.solve(prior[:300, :300] + torch.diag(noise), cross.mT).mT).sum(1)
    assert torch.allclose(grid.posterior_variance(new), exact, rtol=1e-8, atol=1e-10)
