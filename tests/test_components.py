"""Component analysis recovers known structure; Sobol indices match their definition."""

from __future__ import annotations

import math

import pytest
import torch

import lazykern
from lazykern import settings
from lazykern.components import component_analysis, plot_components
from lazykern.regression import build_model, train

from . import reference_interactions as ref

N, D = 400, 8


def synthetic(n: int, generator: torch.Generator):
    """f(x) = sin(x0) + x1^2 + x2 x3 on x ~ N(0, I_8): two first-order components, one interaction."""
    x = torch.randn(n, D, dtype=torch.float64, generator=generator)
    f = torch.sin(x[:, 0]) + x[:, 1] ** 2 + x[:, 2] * x[:, 3]
    return x, f + 0.1 * torch.randn(n, dtype=torch.float64, generator=generator)


def true_first_order(t: torch.Tensor, d: int) -> torch.Tensor:
    """E[f | x_d = t] - E[f]: the first-order components under the standard normal measure."""
    if d == 0:
        return torch.sin(t)
    if d == 1:
        return t**2 - 1
    return torch.zeros_like(t)


@pytest.fixture(scope="module")
def trained():
    x, y = synthetic(N, torch.Generator().manual_seed(1))
    models = {}
    for name in ("oak", "additive-ng"):
        model, likelihood = build_model(x, y - y.mean(), name, max_degree=2)
        with settings.engine("torch"):
            train(model, likelihood, iters=100, progress=False)
        models[name] = model
    return models


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


@pytest.mark.parametrize("name", ["oak", "additive-ng"])
def test_first_order_components_recover_the_truth(trained, name):
    with settings.engine("torch"):
        result = component_analysis(trained[name], grid_size=60)
    scale = true_first_order(result.grid[:, 1], 1).std()
    for d in range(D):
        t = result.grid[:, d]
        inside = t.abs() <= 2  # where the data are; the extremes are extrapolation
        mean, truth = result.mean[inside, d], true_first_order(t[inside], d)
        if d < 2:
            assert _correlation(mean, truth) > 0.95, f"component {d}"
        else:  # no first-order effect: a flat curve
            assert mean.std() < 0.1 * scale, f"component {d} is not flat"
    assert result.variance is not None and bool((result.variance >= 0).all())


def test_oak_order_shares_put_the_interaction_where_it_is(trained):
    with settings.engine("torch"):
        result = component_analysis(trained["oak"], grid_size=20)
    assert result.kind == "sobol"
    # Truth: Var sin(x0) = (1 - e^-2) / 2, Var x1^2 = 2, Var x2 x3 = 1.
    first, second = (1 - math.exp(-2)) / 2 + 2, 1.0
    assert abs(float(result.order_shares[1]) - second / (first + second)) < 0.05
    assert abs(float(result.order_shares.sum()) - 1) < 1e-12
    totals = result.total_effects
    assert float(totals[2]) > 0.2 and float(totals[3]) > 0.2  # x2, x3: through their interaction only
    assert float(result.dimension_shares[2]) < 0.02 and float(result.dimension_shares[3]) < 0.02
    assert float(totals[4:].max()) < 0.02  # irrelevant inputs
    # Two routes to the same number (the order's and the dimensions' derivatives): rounding only.
    assert abs(float(result.dimension_shares.sum()) - float(result.order_shares[0])) < 1e-6


def test_sobol_indices_match_their_definition():
    """Order and total shares from the lazy reduction equal sums over subsets of the squared L2(p)
    norms of the posterior-mean components, from quadrature-built inner products."""
    d, n = 4, 30
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(n, d, dtype=torch.float64, generator=generator)
    y = torch.randn(n, dtype=torch.float64, generator=generator)
    model, _ = build_model(x, y, "oak", max_degree=3)
    kernel = model.covar_module
    kernel.base_kernel.lengthscale = torch.tensor([0.7, 1.0, 1.3, 0.9], dtype=torch.float64)
    kernel.outputscale = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    kernel.measure_mean = torch.full((1, d), 0.1, dtype=torch.float64)
    kernel.measure_std = torch.full((1, d), 0.9, dtype=torch.float64)
    with settings.engine("torch"):
        result = component_analysis(model, grid_size=5)
    alpha = model.prediction_strategy.mean_cache
    # C_d(a, b) = int k~(t, a) k~(t, b) p(t) dt by quadrature of the reference's orthogonal terms.
    t, w = (torch.tensor(v, dtype=torch.float64) for v in __import__("numpy").polynomial.hermite.hermgauss(200))
    nodes = 0.1 + math.sqrt(2) * 0.9 * t
    C = torch.empty(n, n, d, dtype=torch.float64)
    for k in range(d):
        points = torch.zeros(len(t), d, dtype=torch.float64)
        points[:, k] = nodes
        kt = ref.orthogonal_rbf(points, x, kernel.base_kernel.lengthscale, kernel.measure_mean, kernel.measure_std)
        C[..., k] = torch.einsum("t,ta,tb->ab", w / math.sqrt(math.pi), kt[..., k], kt[..., k])
        # The kernel's terms are divided by their average variance under the measure.
        z = ref.orthogonal_rbf(points, points, kernel.base_kernel.lengthscale, kernel.measure_mean,
                               kernel.measure_std, diag=True)[:, k]
        C[..., k] /= (float((w / math.sqrt(math.pi)) @ z)) ** 2
    import itertools

    norms = {}
    for r in range(1, 4):
        for subset in itertools.combinations(range(d), r):
            weight = kernel.outputscale[r - 1].detach() / math.comb(d, r)
            norms[subset] = float(weight**2 * alpha @ C[..., list(subset)].prod(-1) @ alpha)
    total = sum(norms.values())
    for r in range(1, 4):
        expected = sum(v for s, v in norms.items() if len(s) == r) / total
        assert abs(float(result.order_shares[r - 1]) - expected) < 1e-10
    for k in range(d):
        assert abs(float(result.total_effects[k]) - sum(v for s, v in norms.items() if k in s) / total) < 1e-10
        assert abs(float(result.dimension_shares[k]) - norms[(k,)] / total) < 1e-10


def test_sobol_indices_of_a_float32_model_with_an_outlier():
    """An input 14 standard deviations out (pol has them) at lengthscale 0.7: the L2(p) inner
    products overflow float32 (every share was NaN), so the indices are computed in float64."""
    d = 4
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(20, d, dtype=torch.float64, generator=generator)
    y = torch.randn(20, dtype=torch.float64, generator=generator)
    x[0, 0] = 14.0
    shares = {}
    for dtype in (torch.float64, torch.float32):
        model, _ = build_model(x.to(dtype), y.to(dtype), "oak")
        model.covar_module.base_kernel.lengthscale = torch.full((d,), 0.7, dtype=dtype)
        model.eval()
        with settings.engine("torch"):
            shares[dtype] = component_analysis(model, grid_size=3).order_shares
    assert shares[torch.float32].dtype == torch.float32
    assert float((shares[torch.float32].double() - shares[torch.float64]).abs().max()) < 1e-4


def test_plot_and_errors(trained, tmp_path):
    with settings.engine("torch"):
        result = component_analysis(trained["additive-ng"], grid_size=20)
    assert result.kind == "empirical" and result.total_effects is None
    path = plot_components(result, tmp_path / "components.png", title="synthetic")
    assert path.exists() and path.stat().st_size > 0
    with pytest.raises(ValueError, match="does not exist"):
        plot_components(result, tmp_path / "missing" / "c.png")
    model, _ = build_model(torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64), "rbf-ard")
    with pytest.raises(TypeError, match="component_analysis needs a covar_module"):
        component_analysis(model)
    with pytest.raises(ValueError, match="grid_size must be a positive int"):
        component_analysis(trained["oak"], grid_size=0)
    assert isinstance(trained["oak"].covar_module, lazykern.kernels.OrthogonalAdditiveKernel)
