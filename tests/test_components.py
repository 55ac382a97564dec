"""Component analysis recovers known structure (the demo's problem: shapes, an interaction, an
irrelevant input); Sobol indices, pick-freeze total effects and centred components match their
definitions, against dense float64 references."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

import lazykern
from lazykern import settings
from lazykern.components import component_analysis, plot_components, report_lines, summary
from lazykern.data import synthetic_additive
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


def test_first_order_components_recover_the_truth(trained):
    """OAK's components are identified (orthogonal under its measure): its first-order components
    are the truth's shapes. A Newton–Girard kernel's are not (next test)."""
    with settings.engine("torch"):
        result = component_analysis(trained["oak"], grid_size=60)
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


def test_newton_girard_total_effects_recover_the_truth_whatever_its_first_order_terms(trained):
    """A product of RBF terms contains lower-order effects, so a Newton–Girard kernel's split of the
    function into orders is not identified: trained to convergence on this problem (L-BFGS at the
    recipe's 1e-6) it puts 99.9 % of the variance on order 2 (order variances 4e3 and 2e5, the
    lengthscales long), and x1's first-order component is no longer t^2 - 1 (correlation 0.57;
    0.98 where L-BFGS stopped at 1e-4, at a loss 0.09 higher). The function is identified, and so
    are the total effects: f = sin x0 + x1^2 + x2 x3 under N(0, I) has Var 0.432, 2 and 1."""
    with settings.engine("torch"):
        result = component_analysis(trained["additive-ng"], grid_size=20)
    variances = [(1 - math.exp(-2)) / 2, 2.0, 1.0]
    total = sum(variances)
    truth = [variances[0] / total, variances[1] / total, variances[2] / total, variances[2] / total, 0, 0, 0, 0]
    for k in range(D):
        assert float(result.total_effects[k]) == pytest.approx(truth[k], abs=0.08), (k, result.total_effects)
    assert result.ranking()[0] == 1 and set(result.ranking()[-4:]) == {4, 5, 6, 7}
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


def test_sobol_indices_at_an_outlier_and_a_collapsed_lengthscale():
    """UCI's two NaN cases, together: an input 28.6 standard deviations out at lengthscale 0.04
    (OAK on protein) and a lengthscale of 1e-150 (OAK on bike). Every index is finite and
    non-negative, the order shares sum to 1, and the compiled engine agrees with torch's."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(40, 3, dtype=torch.float64, generator=generator)
    x[0, 0] = 28.6
    y = torch.randn(40, dtype=torch.float64, generator=generator)
    model, _ = build_model(x, y, "oak", max_degree=2)
    model.covar_module.base_kernel.lengthscale = torch.tensor([0.04, 1e-150, 0.8], dtype=torch.float64)
    results = {}
    for engine in ("torch", "cpu"):
        with settings.engine(engine):
            results[engine] = component_analysis(model, grid_size=3)
    for result in results.values():
        for shares in (result.order_shares, result.dimension_shares, result.total_effects):
            assert torch.isfinite(shares).all() and float(shares.min()) > -1e-12
        assert abs(float(result.order_shares.sum()) - 1) < 1e-12
        assert float(result.total_effects[1]) < 1e-100  # the spike's L2(p) norm is its lengthscale's order
    for name in ("order_shares", "dimension_shares", "total_effects"):
        assert torch.allclose(getattr(results["cpu"], name), getattr(results["torch"], name), rtol=1e-9, atol=1e-12)


def test_non_finite_shares_are_said(monkeypatch):
    """Shares that are not finite come with a warning naming them, never silently."""
    from lazykern.components import analysis

    x = torch.randn(20, 3, dtype=torch.float64)
    model, _ = build_model(x, torch.randn(20, dtype=torch.float64), "oak", max_degree=2)
    real = analysis._sobol
    monkeypatch.setattr(analysis, "_sobol", lambda *a: (real(*a)[0] * float("nan"), *real(*a)[1:]))
    with settings.engine("torch"), pytest.warns(RuntimeWarning, match="the order shares are not all finite"):
        component_analysis(model, grid_size=3)


def test_plot_and_errors(trained, tmp_path):
    with settings.engine("torch"):
        result = component_analysis(trained["additive-ng"], grid_size=20)
    assert (result.kind, result.total_kind) == ("empirical", "pick-freeze") and result.total_effects_se is not None
    path = plot_components(result, tmp_path / "components.png", title="synthetic", y_mean=3.0, y_std=2.0)
    assert path.exists() and path.stat().st_size > 0
    with pytest.raises(ValueError, match="x_units has 2 entries for 8 dimensions"):
        plot_components(result, tmp_path / "c.png", x_units=["m", "s"])
    with pytest.raises(ValueError, match="does not exist"):
        plot_components(result, tmp_path / "missing" / "c.png")
    model, _ = build_model(torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64), "rbf-ard")
    with pytest.raises(TypeError, match="component_analysis needs a covar_module"):
        component_analysis(model)
    with pytest.raises(ValueError, match="grid_size must be a positive int"):
        component_analysis(trained["oak"], grid_size=0)
    with pytest.raises(ValueError, match="effect_points must be a positive int"):
        component_analysis(trained["oak"], effect_points=0)
    assert isinstance(trained["oak"].covar_module, lazykern.kernels.OrthogonalAdditiveKernel)


# The demo's problem (lazykern.data.synthetic_additive, d = 6): first-order variances of x0..x5 and
# of the interaction 2.5 x1 x2 under the uniform measure the data are drawn from, and under OAK's
# measure (standard normal on the standardized inputs, i.e. t ~ N(0, 1/3)); by quadrature.
UNIFORM = ([0.5233, 0.0889, 0.7502, 0.1234, 0.1090, 0.0], 2.5**2 / 9)
GAUSSIAN = ([0.4993, 0.2222, 0.6780, 0.1349, 0.1249, 0.0], 2.5**2 / 9)


def truth(variances) -> tuple[list[float], list[float]]:
    """(order shares 1 and 2, total effects) of the demo's generating function."""
    first, pair = variances
    total = sum(first) + pair
    effects = [v + (pair if k in (1, 2) else 0.0) for k, v in enumerate(first)]
    return [sum(first) / total, pair / total], [e / total for e in effects]


def test_demo_truth_is_what_the_generator_draws():
    """The generating function's variances above, from a large draw (noise-free, unstandardized)."""
    data = synthetic_additive(200000, 1, 6, noise=0.0)
    x = data.train_x * data.x_std + data.x_mean
    y = data.train_y * data.y_std
    first, pair = UNIFORM
    assert float(y.var()) == pytest.approx(sum(first) + pair, rel=0.01)
    residual = y - 2.5 * x[:, 1] * x[:, 2]
    assert float(residual.var()) == pytest.approx(sum(first), rel=0.01)


def demo(name: str):
    """``name`` (all orders) trained on the demo's problem, analysed."""
    data = synthetic_additive(400, 10, 6, seed=0)
    torch.manual_seed(0)
    model, likelihood = build_model(data.train_x, data.train_y, name)
    with settings.engine("torch"):
        train(model, likelihood, iters=100, progress=False)
        return component_analysis(model, grid_size=20)


# OAK's indices are under its measure, N(0, 1) on the standardized inputs: 8 % of its mass lies
# beyond the data's range (|t| > 1), where the posterior mean returns towards the prior's instead of
# following t^2 or tanh 4t, so its total effects and order shares are held to a looser tolerance
# than its ranking. Once L-BFGS converges (the recipe's 1e-6) its first-order share is 0.807 against
# the truth's 0.705 and x1's total effect 0.264 against 0.389 (0.780 and 0.300 where L-BFGS stopped
# at 1e-4, at a training loss 0.004 higher): the fit's extrapolation, not the analysis, moves them.
@pytest.mark.parametrize("name, measure, tolerance", [("additive-ng", UNIFORM, 0.08), ("oak", GAUSSIAN, 0.15)])
def test_demo_ranking_and_order_shares_match_the_truth(name, measure, tolerance):
    result = demo(name)
    orders, effects = truth(measure)
    # x2 (tanh and the interaction), x1 (mostly the interaction: the smallest non-zero first-order
    # share), x0 (sin alone); x5 is irrelevant.
    assert result.ranking()[:3] == [2, 1, 0] and result.ranking()[-1] == 5
    assert float(result.dimension_shares[1]) < 0.1 < float(result.total_effects[1])
    assert float(result.order_shares[0]) == pytest.approx(orders[0], abs=tolerance)
    assert float(result.order_shares[1]) == pytest.approx(orders[1], abs=tolerance)
    assert float(result.order_shares[2:].sum()) < 0.02
    for k in range(6):
        assert float(result.total_effects[k]) == pytest.approx(effects[k], abs=tolerance), (k, result.total_effects)
    # The report names the same inputs first, with the definition of its measure.
    lines = report_lines(summary(result))
    assert lines[2].split()[2:8:2] == ["x2:", "x1:", "x0:"]
    assert "total Sobol index" in lines[4]


def test_pick_freeze_total_effects_match_their_definition():
    """Newton-Girard's Monte-Carlo total effects against the exact T_i of the posterior mean under
    the product of the training marginals: every point of the n^d product grid, the mean from a
    dense float64 reference kernel (subsets enumerated)."""
    n, d = 9, 3
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(n, d, dtype=torch.float64, generator=generator)
    y = torch.randn(n, dtype=torch.float64, generator=generator)
    model, _ = build_model(x, y, "additive-ng")
    kernel = model.covar_module
    kernel.base_kernel.lengthscale = torch.tensor([0.6, 1.0, 1.5], dtype=torch.float64)
    kernel.outputscale = torch.tensor([0.3, 0.4, 0.3], dtype=torch.float64)
    with settings.engine("torch"):
        result = component_analysis(model, grid_size=3, effect_points=20000)
    alpha = model.prediction_strategy.mean_cache
    grid = torch.cartesian_prod(*(x[:, k] for k in range(d)))  # (n^d, d): the product measure, exactly
    z = ref.per_dimension("rbf", grid, x, kernel.base_kernel.lengthscale.detach())
    m = ref.orders(z, kernel.outputscale.detach(), None, d) @ alpha
    m = m.reshape(n, n, n)
    exact = torch.stack([m.var(k, unbiased=False).mean() for k in range(d)]) / m.var(unbiased=False)
    assert result.total_kind == "pick-freeze"
    error = (result.total_effects - exact).abs()
    assert bool((error < 4 * result.total_effects_se).all()), (result.total_effects, exact, result.total_effects_se)
    assert float(result.total_effects_se.max()) < 0.02


@pytest.mark.parametrize("name, options", [("additive-rbf", {}), ("dpa-rbf", {"num_projections": 5})])
def test_first_order_models_total_effect_is_the_first_order_share(name, options):
    """additive-rbf, and a projected kernel (one component per projection w_j^T x): exact, no
    Monte Carlo; centred components, their variances and their shares against the dense float64
    joint posterior of (f_k(grid), f_k(X)) along each component's axis."""
    n, d = 40, 3
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(n, d, dtype=torch.float64, generator=generator)
    y = torch.sin(x[:, 0]) + 0.3 * x[:, 1] + 0.1 * torch.randn(n, dtype=torch.float64, generator=generator)
    model, likelihood = build_model(x, y, name, **options)
    kernel = model.covar_module.base_kernel
    count = kernel.component_scales.shape[-1]
    kernel.component_scales = torch.linspace(0.7, 0.1, count, dtype=torch.float64).unsqueeze(0)
    with settings.engine("torch"):
        result = component_analysis(model, grid_size=7)
    assert result.total_kind == "first-order" and result.total_effects_se is None
    assert torch.equal(result.total_effects, result.dimension_shares)
    coordinates = x @ kernel.projections.detach() if options else x
    assert result.axes == ("projections" if options else "inputs") and result.mean.shape == (7, count)
    assert torch.allclose(result.train_x, coordinates, atol=1e-12)
    lengthscale = kernel.base_kernel.lengthscale.detach().reshape(-1).expand(count)
    weights = (model.covar_module.outputscale * kernel.component_scales).detach().reshape(-1)
    K = model.covar_module(x).to_dense().detach() + likelihood.noise.detach() * torch.eye(n, dtype=torch.float64)
    alpha = torch.linalg.solve(K, y - model.mean_module.constant.detach())
    at_train = []
    for k in range(count):
        points = torch.cat([result.grid[:, k], coordinates[:, k]])
        prior = weights[k] * torch.exp(-0.5 * ((points[:, None] - points[None]) / lengthscale[k]) ** 2)
        cross = prior[:, -n:]
        mean = cross @ alpha
        covariance = prior - cross @ torch.linalg.solve(K, cross.T)
        centring = torch.cat([torch.eye(7, dtype=torch.float64), torch.full((7, n), -1.0 / n, dtype=torch.float64)], 1)
        assert torch.allclose(result.mean[:, k], centring @ mean, atol=1e-8)
        assert torch.allclose(result.variance[:, k], torch.diag(centring @ covariance @ centring.T), atol=1e-8)
        assert float(result.offsets[k]) == pytest.approx(float(mean[-n:].mean()), abs=1e-8)
        at_train.append(mean[-n:])
    at_train = torch.stack(at_train)  # (components, n): each component at the training inputs
    shares = at_train.var(-1) / at_train.sum(0).var()
    assert torch.allclose(result.dimension_shares, shares, atol=1e-10)
    assert result.order_shares.tolist() == [1.0]


def test_gpytorch_additive_kernel_is_analysed_as_lazykerns():
    """GPyTorch's AdditiveStructureKernel is described by lazykern's (lazykern.kernels.family_of): its
    components are those of lazykern's kernel with the same hyperparameters."""
    n, d = 40, 3
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(n, d, dtype=torch.float64, generator=generator)
    y = torch.sin(x[:, 0]) + 0.3 * x[:, 1] + 0.1 * torch.randn(n, dtype=torch.float64, generator=generator)
    results = []
    for kernel in (gpytorch.kernels.AdditiveStructureKernel(gpytorch.kernels.RBFKernel(), num_dims=d),
                   lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=d)):
        kernel.base_kernel.lengthscale = 0.8
        model, _ = build_model(x, y, gpytorch.kernels.ScaleKernel(kernel))
        with settings.engine("torch"):
            results.append(component_analysis(model, grid_size=5))
    assert results[0].axes == "inputs" and results[0].total_kind == "first-order"
    for name in ("mean", "variance", "dimension_shares", "total_effects"):
        torch.testing.assert_close(getattr(results[0], name), getattr(results[1], name))
