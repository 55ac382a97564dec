"""BoTorch's pathwise sampling on lazykern's kernels (lazykern.botorch): features, paths, CG update.

Tolerances come from the Monte Carlo error, estimated from independent repetitions (each with its
own random features): an average of R repetitions must lie within ``SES`` standard errors of the
exact value, and the standard error must be small enough (a fraction of the variance) for the
comparison to mean something. Everything is float64 on a few points, so the kernels run on the
chunked torch engine and nothing compiles.
"""

from __future__ import annotations

import functools
import math

import gpytorch
import pytest
import torch

import lazykern
import lazykern.botorch  # registers the feature maps and the update

from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.acquisition.utils import get_optimal_samples
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.sampling.pathwise import draw_kernel_feature_paths, draw_matheron_paths
from botorch.sampling.pathwise.features import gen_kernel_features
from botorch.sampling.pathwise.update_strategies import _gaussian_update_ExactGP

from .memory import peak_rss_increase_mb

D = 3
#: Standard errors allowed: for a t statistic with 19 or more degrees of freedom, P(|t| > 5) < 1e-4.
SES = 5.0
#: Prior paths with 4096 features: the features' randomness dominates the paths' covariance
#: error (it varies from one draw of features to the next), and it falls as 1 / sqrt(features).
#: Their weights are plain normals: BoTorch's scrambled Sobol normals in 4096 dimensions took 80%
#: of the test's time.
PRIOR_SAMPLER = functools.partial(
    draw_kernel_feature_paths, num_features=4096, weight_generator=lambda shape: torch.randn(shape, dtype=DTYPE)
)
DTYPE = torch.float64


def _rbf(ard: int = D) -> lazykern.RBFKernel:
    kernel = lazykern.RBFKernel(ard_num_dims=ard)
    kernel.lengthscale = torch.tensor([0.2, 0.5, 1.0])[:ard]
    return kernel


def _additive_rbf() -> lazykern.AdditiveStructureKernel:
    kernel = lazykern.AdditiveStructureKernel(_rbf(), num_dims=D, component_scales=True)
    kernel.component_scales = torch.tensor([0.5, 1.0, 2.0])
    return kernel


def _additive(base: gpytorch.kernels.Kernel, **hypers: float) -> lazykern.AdditiveStructureKernel:
    base.initialize(**hypers)
    return lazykern.AdditiveStructureKernel(base, num_dims=D)


def _groups() -> lazykern.GroupAdditiveKernel:
    kernel = lazykern.GroupAdditiveKernel(_rbf(), groups=[(0, 1), (1, 2)], component_scales=True)
    kernel.component_scales = torch.tensor([0.3, 2.0])
    return kernel


def _first_order() -> lazykern.NewtonGirardAdditiveKernel:
    kernel = lazykern.NewtonGirardAdditiveKernel(_rbf(), num_dims=D, max_degree=1, component_scales=True)
    kernel.component_scales = torch.tensor([0.5, 1.0, 2.0])
    kernel.outputscale = torch.tensor([2.0])
    return kernel


def _orders() -> lazykern.NewtonGirardAdditiveKernel:
    kernel = lazykern.NewtonGirardAdditiveKernel(lazykern.MaternKernel(nu=1.5, ard_num_dims=D), num_dims=D,
                                                 component_scales=True)
    kernel.base_kernel.lengthscale = torch.tensor([0.3, 0.5, 1.0])
    kernel.component_scales = torch.tensor([0.5, 1.0, 2.0])
    kernel.outputscale = torch.tensor([1.0, 0.5, 0.25])
    return kernel


def _orthogonal(max_degree: int) -> lazykern.OrthogonalAdditiveKernel:
    kernel = lazykern.OrthogonalAdditiveKernel(num_dims=D, max_degree=max_degree, component_scales=True,
                                               measure_mean=0.5, measure_std=0.3)
    kernel.base_kernel.lengthscale = torch.tensor([0.3, 1.0, 3.0])
    kernel.component_scales = torch.tensor([0.5, 1.0, 2.0])
    return kernel


#: Every kernel of the additive family that has random features, each inside a ScaleKernel.
ADDITIVE = {
    "additive_rbf": _additive_rbf,
    "additive_matern12": lambda: _additive(lazykern.MaternKernel(nu=0.5), lengthscale=0.3),
    "additive_matern32": lambda: _additive(lazykern.MaternKernel(nu=1.5), lengthscale=0.3),
    "additive_rq": lambda: _additive(lazykern.RQKernel(), lengthscale=0.3, alpha=0.7),
    "additive_periodic": lambda: _additive(lazykern.PeriodicKernel(), lengthscale=0.5, period_length=0.7),
    "additive_active_dims": lambda: lazykern.AdditiveStructureKernel(_rbf(2), num_dims=2, active_dims=(0, 2)),
    "groups": _groups,
    "newton_girard_order_1": _first_order,
    "newton_girard_orders_1_to_3": _orders,
    "orthogonal_order_1": lambda: _orthogonal(1),
    "orthogonal_orders_1_to_3": lambda: _orthogonal(3),
    "gpytorch_additive": lambda: gpytorch.kernels.AdditiveStructureKernel(gpytorch.kernels.RBFKernel(), num_dims=D),
}


def _full_rq() -> lazykern.RQKernel:
    kernel = lazykern.RQKernel(ard_num_dims=D)
    kernel.initialize(lengthscale=torch.tensor([0.2, 0.5, 1.0]), alpha=0.7)
    return kernel


def _full_periodic() -> lazykern.PeriodicKernel:
    kernel = lazykern.PeriodicKernel(ard_num_dims=D)
    kernel.initialize(lengthscale=torch.tensor([0.2, 0.5, 1.0]), period_length=torch.tensor([0.5, 1.0, 2.0]))
    return kernel


FULL = {"rq": _full_rq, "periodic": _full_periodic}


def _scaled(kernel: gpytorch.kernels.Kernel) -> gpytorch.kernels.ScaleKernel:
    scaled = gpytorch.kernels.ScaleKernel(kernel)
    scaled.outputscale = 1.5
    return scaled.to(DTYPE)


def _mean_and_standard_error(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack(samples)
    return stacked.mean(0), stacked.std(0) / len(samples) ** 0.5


#: Features per map in the tests of Phi Phi^T: enough for OAK's, whose single projected cosines
#: vary most (their standard error is ~6% of the largest variance at 2048).
FEATURES = 32768


@pytest.mark.parametrize("name", [*ADDITIVE, *FULL])
def test_features_approximate_the_kernel(name: str) -> None:
    """The average of Phi Phi^T over 20 independent maps of 32768 features is the kernel matrix,
    within SES standard errors of that average (each entry)."""
    torch.manual_seed(0)
    kernel = _scaled({**ADDITIVE, **FULL}[name]())
    x = torch.rand(5, D, dtype=DTYPE)
    with torch.no_grad():
        exact = kernel(x).to_dense()
        estimates = []
        for _ in range(20):
            phi = gen_kernel_features(kernel, num_inputs=D, num_outputs=FEATURES)(x)
            estimates.append(phi @ phi.T)
    assert phi.shape == (5, FEATURES)
    assert gen_kernel_features(kernel, num_inputs=D, num_outputs=FEATURES).num_outputs == FEATURES
    mean, se = _mean_and_standard_error(estimates)
    assert float(se.max()) < 0.02 * float(exact.diagonal().max())
    assert bool(((mean - exact).abs() <= SES * se + 1e-10).all()), ((mean - exact) / se).abs().max()


def _model(kernel: gpytorch.kernels.Kernel, n: int = 15, seed: int = 0) -> SingleTaskGP:
    torch.manual_seed(seed)
    X = torch.rand(n, D, dtype=DTYPE)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = SingleTaskGP(X, Y, covar_module=_scaled(kernel))
    model.likelihood.noise = 1e-2
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", ADDITIVE)
def test_matheron_paths_have_the_posterior_covariance(name: str) -> None:
    """20,000 posterior paths (40 draws of 500, each draw with its own 4096 features) at 3 points: their
    covariance about the posterior mean is the model's posterior covariance. Averaged over the
    features' randomness Matheron's rule is exact (E[k_hat] = k makes the prior and update terms'
    errors cancel), so the tolerance is the Monte Carlo error of the 20 draws, not a feature bias."""
    model = _model(ADDITIVE[name]())
    x = torch.rand(3, D, dtype=DTYPE)
    with torch.no_grad():
        posterior = model.posterior(x)
        mean, exact = posterior.mean.squeeze(-1), posterior.covariance_matrix
        covariances = []
        for _ in range(40):
            f = draw_matheron_paths(model, sample_shape=torch.Size([500]), prior_sampler=PRIOR_SAMPLER)(x)
            assert f.shape == (500, 3)
            centred = f - mean
            covariances.append(centred.T @ centred / f.shape[0])
    estimate, se = _mean_and_standard_error(covariances)
    assert float(se.max()) < 0.05 * float(exact.diagonal().max())
    assert bool(((estimate - exact).abs() <= SES * se).all()), ((estimate - exact) / se).abs().max()


def test_cg_update_equals_the_cholesky_update() -> None:
    """Above max_cholesky_size the update solves by CG: the same weights as BoTorch's Cholesky
    update for the same prior values and noise (same seed), to CG's tolerance."""
    model = _model(_additive_rbf(), n=40)
    sample_values = torch.randn(6, 40, dtype=DTYPE)
    torch.manual_seed(1)
    exact = _gaussian_update_ExactGP(model, model.likelihood, sample_values=sample_values)
    torch.manual_seed(1)
    with gpytorch.settings.max_cholesky_size(0):
        solved = lazykern.botorch.gaussian_update(model, model.likelihood, sample_values=sample_values, tol=1e-10)
    assert torch.allclose(solved.weight, exact.weight, rtol=1e-6, atol=1e-8)
    x = torch.rand(4, D, dtype=DTYPE)
    assert torch.allclose(solved(x), exact(x), rtol=1e-6, atol=1e-8)


def test_cg_update_of_a_two_output_model() -> None:
    """A batched kernel (two outputs) gets one CG solve per output: the same weights as Cholesky's,
    and its paths have the outputs as a batch dimension."""
    torch.manual_seed(0)
    X = torch.rand(30, D, dtype=DTYPE)
    Y = torch.stack([X.sum(-1), X.prod(-1)], -1)
    base = lazykern.RBFKernel(ard_num_dims=D, batch_shape=torch.Size([2]))
    kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=D, component_scales=True),
                                          batch_shape=torch.Size([2]))
    model = SingleTaskGP(X, Y, covar_module=kernel)
    sample_values = torch.randn(5, 2, 30, dtype=DTYPE)
    torch.manual_seed(1)
    exact = _gaussian_update_ExactGP(model, model.likelihood, sample_values=sample_values)
    torch.manual_seed(1)
    with gpytorch.settings.max_cholesky_size(0):
        solved = lazykern.botorch.gaussian_update(model, model.likelihood, sample_values=sample_values, tol=1e-10)
        paths = draw_matheron_paths(model, sample_shape=torch.Size([4]))
    assert torch.allclose(solved.weight, exact.weight, rtol=1e-6, atol=1e-8)
    assert paths(X[:3]).shape == (4, 2, 3)


def test_models_without_lazykern_kernels_keep_botorchs_update() -> None:
    model = SingleTaskGP(torch.rand(10, D, dtype=DTYPE), torch.rand(10, 1, dtype=DTYPE))
    with gpytorch.settings.max_cholesky_size(0):
        torch.manual_seed(2)
        ours = lazykern.botorch.gaussian_update(model, model.likelihood, sample_values=torch.zeros(10, dtype=DTYPE))
    torch.manual_seed(2)
    botorchs = _gaussian_update_ExactGP(model, model.likelihood, sample_values=torch.zeros(10, dtype=DTYPE))
    assert torch.equal(ours.weight, botorchs.weight)


@pytest.mark.parametrize("name", ["groups", "orthogonal_orders_1_to_3"])
def test_thompson_sampling_inside_optimize_acqf(name: str) -> None:
    """A pathwise Thompson sample of an additive model is maximised by optimize_acqf (gradients reach
    the candidate through the features and the update's kernel evaluations)."""
    model = _model(ADDITIVE[name]())
    bounds = torch.stack([torch.zeros(D), torch.ones(D)]).to(DTYPE)
    acquisition = PathwiseThompsonSampling(model)
    candidate, value = optimize_acqf(acquisition, bounds=bounds, q=1, num_restarts=2, raw_samples=32)
    assert candidate.shape == (1, D) and bool(((candidate >= 0) & (candidate <= 1)).all())
    assert torch.isfinite(value).all()


def test_get_optimal_samples() -> None:
    """The optima of posterior paths (what the information-theoretic acquisitions are built on)."""
    model = _model(_orthogonal(2))
    bounds = torch.stack([torch.zeros(D), torch.ones(D)]).to(DTYPE)
    optima, values = get_optimal_samples(model, bounds=bounds, num_optima=4)
    assert optima.shape == (4, D) and values.shape == (4, 1)
    assert bool(((optima >= 0) & (optima <= 1)).all()) and bool(torch.isfinite(values).all())


@pytest.mark.parametrize(
    ("kernel", "name"),
    [
        (lambda: _rbf() * lazykern.MaternKernel(), "ProductKernel"),
        (lambda: gpytorch.kernels.AdditiveStructureKernel(_rbf(), num_dims=D), "AdditiveStructureKernel"),
    ],
)
def test_unsupported_kernels_name_themselves(kernel, name: str) -> None:
    model = _model(kernel())
    with pytest.raises(NotImplementedError, match=name) as error:
        draw_matheron_paths(model, sample_shape=torch.Size([2]))
    assert "\n" not in str(error.value)


def test_order_features_are_unbiased_for_hyperparameters_changed_after_they_were_made() -> None:
    """The orders' features read the hyperparameters when evaluated (importance weights): after
    the order variances and scales change, the average of Phi Phi^T is still the kernel."""
    torch.manual_seed(3)
    kernel = _orders().to(DTYPE)
    x = torch.rand(4, D, dtype=DTYPE)
    maps = [gen_kernel_features(kernel, num_inputs=D, num_outputs=2048) for _ in range(20)]
    kernel.outputscale = torch.tensor([0.2, 1.0, 2.0])
    kernel.component_scales = torch.tensor([1.5, 0.7, 1.0])
    with torch.no_grad():
        exact = kernel(x).to_dense()
        mean, se = _mean_and_standard_error([phi(x) @ phi(x).T for phi in maps])
    assert bool(((mean - exact).abs() <= SES * se + 1e-10).all()), ((mean - exact) / se).abs().max()


def test_too_few_features_for_the_terms() -> None:
    from botorch.exceptions.errors import UnsupportedError

    kernel = lazykern.AdditiveStructureKernel(_rbf(), num_dims=D)
    with pytest.raises(UnsupportedError, match="at least 2 per term"):
        gen_kernel_features(kernel, num_inputs=D, num_outputs=4)


@pytest.mark.slow
def test_paths_at_ten_thousand_points_form_no_n_by_n_matrix() -> None:
    """Drawing paths of a 10,000-point model grows the peak RSS by far less than one N x N float64
    matrix (800 MB): the update solves by CG on the lazy operator (dense budget off, so nothing N x N
    is kept either). What remains is BoTorch's N x 1024 prior features (80 MB, with temporaries)."""
    setup = """
        import torch, gpytorch, lazykern, lazykern.botorch
        from botorch.models import SingleTaskGP
        from botorch.sampling.pathwise import draw_kernel_feature_paths, draw_matheron_paths
        torch.manual_seed(0)
        n, d = 10000, 4
        X = torch.rand(n, d, dtype=torch.float64)
        Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, dtype=torch.float64)
        kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=d))
        kernel.base_kernel.base_kernel.lengthscale = 0.3
        model = SingleTaskGP(X, Y, covar_module=kernel)
        model.likelihood.noise = 1e-2
    """
    body = """
        with torch.no_grad(), lazykern.settings.max_dense_bytes(0):
            values = draw_matheron_paths(model, sample_shape=torch.Size([4]))(X[:5])
        assert values.shape == (4, 5) and bool(torch.isfinite(values).all())
    """
    assert peak_rss_increase_mb(setup, body) < 400


def _lognormal(kernel_module: gpytorch.Module, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    prior = getattr(kernel_module, f"{name}_prior")
    assert isinstance(prior, gpytorch.priors.LogNormalPrior)
    return prior.loc, prior.scale


@pytest.mark.parametrize("kind", ["additive", "groups", "orders", "projected", "gpytorch"])
def test_additive_priors_follow_the_dimensions_of_each_term(kind: str) -> None:
    """BoTorch's lengthscale prior, LogNormal(sqrt 2 + log(k) / 2, sqrt 3), for terms on k dimensions; the
    weights' priors give the sum a median variance of 1; lengthscales start at the prior's mode."""
    num_dims = 4
    if kind == "additive":
        inner, term_dims = lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=num_dims), num_dims=num_dims,
                                                            component_scales=True), [1, 1, 1, 1]
    elif kind == "groups":
        inner = lazykern.GroupAdditiveKernel(lazykern.MaternKernel(nu=2.5, ard_num_dims=num_dims),
                                             groups=[(0, 1, 2), (2, 3), (3,)], component_scales=True)
        term_dims = [3, 3, 3, 2]
    elif kind == "orders":
        inner = lazykern.NewtonGirardAdditiveKernel(lazykern.RBFKernel(ard_num_dims=num_dims), num_dims=num_dims,
                                                    max_degree=2)
        term_dims = [2, 2, 2, 2]
    elif kind == "projected":  # J = 6 one-dimensional terms on projections; one shared base lengthscale
        inner = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), num_dims=num_dims, num_projections=6)
        term_dims = [1]
    else:
        inner, term_dims = gpytorch.kernels.AdditiveStructureKernel(gpytorch.kernels.RBFKernel(), num_dims), [1]
    kernel = gpytorch.kernels.ScaleKernel(inner).double()
    assert lazykern.botorch.additive_priors(kernel) is kernel
    expected_loc = math.sqrt(2) + 0.5 * torch.tensor(term_dims, dtype=DTYPE).log()
    loc, scale = _lognormal(inner.base_kernel, "lengthscale")
    torch.testing.assert_close(loc.to(DTYPE), expected_loc, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(scale.to(DTYPE), torch.full_like(expected_loc, math.sqrt(3)), rtol=1e-15, atol=0)
    torch.testing.assert_close(inner.base_kernel.lengthscale.detach().flatten(), (expected_loc - 3).exp())
    terms = {"additive": 4, "groups": 3, "projected": 6, "gpytorch": 4}.get(kind)
    if kind == "orders":
        assert float(_lognormal(inner, "outputscale")[0]) == pytest.approx(-math.log(2), abs=1e-15)
        torch.testing.assert_close(inner.outputscale.detach(), torch.full((2,), 0.5, dtype=DTYPE))
        assert float(_lognormal(kernel, "outputscale")[0]) == 0
    elif kind == "gpytorch":  # no per-term weights: the ScaleKernel carries the 1 / T
        assert float(_lognormal(kernel, "outputscale")[0]) == pytest.approx(-math.log(terms), abs=1e-15)
        assert float(kernel.outputscale.detach()) == pytest.approx(1 / terms)
    else:
        assert float(_lognormal(inner, "component_scales")[0]) == pytest.approx(-math.log(terms), abs=1e-15)
        torch.testing.assert_close(inner.component_scales.detach(), torch.full((1, terms), 1 / terms, dtype=DTYPE))
        assert float(_lognormal(kernel, "outputscale")[0]) == 0
    # The marginal likelihood BoTorch fits includes them (their log densities change it).
    X = torch.rand(6, num_dims, dtype=DTYPE)
    model = SingleTaskGP(X, X.sum(-1, keepdim=True), covar_module=kernel)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    output = model(X)
    expected = sum(prior.log_prob(closure(module)).sum() for _, module, prior, closure, _ in model.named_priors())
    assert {name for name, *_ in kernel.named_priors()} < {name.removeprefix("covar_module.")
                                                           for name, *_ in model.named_priors()}
    torch.testing.assert_close(mll(output, model.train_targets) * 6,
                               model.likelihood(output).log_prob(model.train_targets) + expected)


def test_additive_priors_name_what_they_take() -> None:
    with pytest.raises(TypeError, match="^additive_priors: kernel must be an AdditiveStructureKernel .*got "
                                        r"ScaleKernel\(RBFKernel\)$"):
        lazykern.botorch.additive_priors(gpytorch.kernels.ScaleKernel(lazykern.RBFKernel()))
