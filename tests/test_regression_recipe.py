"""The regression job's kernels, initialization and optimizers (small problems, torch engine)."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch
from linear_operator.utils.errors import NotPSDError

import lazykern
from lazykern import regression, settings
from lazykern.components import plot_components
from lazykern.kernels.projected import diverse_directions
from lazykern.regression import build_model, fit_evaluate, initialize, make_kernel, train, warm_start


def test_kernel_names_and_max_degree():
    assert {"additive-ng", "oak"} <= set(regression.KERNELS) and regression.DEFAULT_KERNEL in regression.KERNELS
    ng = make_kernel("additive-ng", 6)
    assert isinstance(ng, lazykern.kernels.NewtonGirardAdditiveKernel) and ng.max_degree == 6  # all orders
    oak = make_kernel("oak", 6, max_degree=2)
    assert isinstance(oak, lazykern.kernels.OrthogonalAdditiveKernel) and oak.outputscale.shape == (2,)
    with pytest.raises(ValueError, match="max_degree applies to the additive-ng and oak kernels only"):
        make_kernel("rbf-ard", 6, max_degree=2)
    with pytest.raises(ValueError, match="max_degree must be at most num_dims=6"):
        make_kernel("oak", 6, max_degree=7)
    with pytest.raises(ValueError, match="kernel must be one of"):
        make_kernel("ng", 6)
    with pytest.raises(ValueError, match="max_degree applies to kernels given by name"):
        build_model(torch.randn(5, 2), torch.randn(5), make_kernel("rbf-ard", 2), max_degree=2)


def test_projected_kernel_names_and_num_projections():
    kernel = make_kernel("rpa-rbf", 5)
    assert isinstance(kernel.base_kernel, lazykern.ProjectedAdditiveKernel)
    assert kernel.base_kernel.projections.shape == (5, lazykern.kernel_names.default_num_projections(5)) == (5, 10)
    assert make_kernel("dpa-matern52", 5, num_projections=3).base_kernel.projections.shape == (5, 3)
    with pytest.raises(ValueError, match="num_projections applies to the dpa-matern52, dpa-rbf, dpa-matern52-learned, rpa-matern52, rpa-rbf"):
        make_kernel("oak", 5, num_projections=3)
    with pytest.raises(ValueError, match="num_projections must be a positive int or None, got 0"):
        make_kernel("dpa-rbf", 5, num_projections=0)
    with pytest.raises(ValueError, match="num_projections applies to kernels given by name"):
        build_model(torch.randn(5, 2), torch.randn(5), make_kernel("rbf-ard", 2), num_projections=2)


def test_learned_directions_by_name_train_the_directions_in_place_of_lengthscales():
    x = torch.randn(30, 4, dtype=torch.float64)
    model, likelihood = build_model(x, torch.sin(x.sum(-1)), "dpa-matern52-learned", num_projections=6)
    projected = model.covar_module.base_kernel
    fixed = make_kernel("dpa-matern52", 4, num_projections=6).base_kernel
    assert isinstance(projected.projections, torch.nn.Parameter) and projected.projections.requires_grad
    assert torch.equal(projected.projections.detach(), fixed.projections.to(torch.float64))  # DPA's, to start
    assert not projected.base_kernel.raw_lengthscale.requires_grad  # the directions' lengths are the lengthscales
    assert projected.input_lengthscale is None
    before = projected.projections.detach().clone()
    train(model, likelihood, iters=3, progress=False)
    assert not torch.equal(projected.projections.detach(), before)


def _with_discrete_inputs(n=40):
    """Columns: binary (values 3 and 5), continuous, four levels 0.5 apart, constant."""
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(n, dtype=torch.float64)
    return torch.stack([3 + 2 * (rows % 2), torch.randn(n, generator=g, dtype=torch.float64), (rows % 4) / 2,
                        torch.ones(n, dtype=torch.float64)], -1)


def test_discrete_columns_are_the_few_valued_ones():
    x = _with_discrete_inputs()
    assert regression.discrete_columns(x) == {0: 2.0, 2: 0.5}  # not the continuous or the constant column
    assert regression.discrete_columns(x[:6]) == {0: 2.0}  # 4 levels in 6 rows: more than half as many
    assert regression.discrete_columns(torch.arange(26.0).reshape(-1, 1) % 13) == {}  # 13 levels


@pytest.mark.parametrize("name", ["rbf-ard", "gpytorch-rbf-ard", "additive-matern52", "additive-ng", "oak",
                                  "dpa-matern52"])
def test_named_kernels_floor_the_lengthscales_of_discrete_inputs(name):
    x = _with_discrete_inputs()
    model, _ = build_model(x, torch.randn(40, dtype=torch.float64), name)
    if name.startswith("dpa-"):  # the input lengthscales, divided out before projecting
        owner, attribute = model.covar_module.base_kernel, "input_lengthscale"
    else:
        owner = next(m for m in model.covar_module.modules() if getattr(m, "has_lengthscale", False)
                     and m.lengthscale.shape[-1] == 4)
        attribute = "lengthscale"
    start = getattr(owner, attribute).detach().reshape(-1)
    assert start[0] >= 2 * 2.0 / 3 and start[2] >= 2 * 0.5 / 3  # at least twice the floor to start
    getattr(owner, f"raw_{attribute}").data.fill_(-60.0)  # as far down as training could push them
    floors = torch.tensor([2.0 / 3, 0.0, 0.5 / 3, 0.0], dtype=torch.float64)
    assert torch.allclose(getattr(owner, attribute).detach().reshape(-1), floors, atol=1e-12)
    # A kernel module is used as given; a projected kernel without input lengthscales has none to bound.
    module = make_kernel(name, 4)
    before = module.state_dict()
    model, _ = build_model(x, torch.randn(40, dtype=torch.float64), module)
    assert all(torch.equal(before[k], v.to(before[k])) for k, v in module.state_dict().items() if k in before)
    plain = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), num_dims=4, num_projections=3)
    assert regression.floor_discrete_lengthscales(plain, x) == {}


@pytest.mark.parametrize(
    "name, width",
    [("rbf-ard", 16), ("gpytorch-rbf-ard", 16), ("additive-rbf", 1), ("additive-ng", 16), ("oak", 3)],
)
def test_lengthscales_start_at_the_root_of_the_dimensions_a_term_multiplies(name, width):
    kernel = make_kernel(name, 16, max_degree=3 if name == "oak" else None)
    initialize(kernel, 16)
    inner = kernel.base_kernel if isinstance(kernel, lazykern.kernels.NewtonGirardAdditiveKernel) else kernel
    base = inner.base_kernel if hasattr(inner, "base_kernel") else inner
    base = base.base_kernel if hasattr(base, "base_kernel") else base
    assert torch.allclose(base.lengthscale, torch.full_like(base.lengthscale, math.sqrt(width)))
    model, likelihood = build_model(torch.randn(10, 16), torch.randn(10), name)
    assert abs(likelihood.noise.item() - regression.INITIAL_NOISE) < 1e-6


def test_group_kernel_starts_at_its_widest_group():
    kernel = lazykern.kernels.GroupAdditiveKernel(lazykern.RBFKernel(ard_num_dims=5), [(0, 1), (1, 2, 3, 4)])
    initialize(kernel, 5)
    assert torch.allclose(kernel.base_kernel.lengthscale, torch.full((1, 5), 2.0))
    with pytest.raises(TypeError, match="initialize knows"):
        initialize(torch.nn.Identity(), 3)  # type: ignore[arg-type]


def _relevant_two_of(d: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    y = torch.sin(2 * x[:, 0]) * x[:, 1] + 0.05 * torch.randn(n, dtype=torch.float64, generator=g)
    return x, (y - y.mean()) / y.std()


@pytest.mark.parametrize("optimizer, tolerance", [("lbfgs", 1e-4), ("adam", 1e-3)])
def test_optimizers_converge_and_stop(optimizer, tolerance):
    x, y = _relevant_two_of(4, 120, 0)
    model, likelihood = build_model(x, y, "rbf-ard")
    with settings.engine("torch"):
        losses = train(model, likelihood, iters=300, optimizer=optimizer, tolerance=tolerance, progress=False)
    assert losses[-1] < losses[0] - 5
    assert len(losses) < 300, "stopped by convergence, not by the step limit"
    assert losses.converged and losses.stop_reason == ("plateau" if optimizer == "adam" else
                                                       "loss change below tolerance")
    assert losses.iterations <= 300 and not losses.interventions
    assert losses.float64_from is None and losses.tolerance == tolerance


class _BatchGP(gpytorch.models.ExactGP):
    """A user's exact GP with a batch shape: ARD RBF, constant mean, batch-shaped likelihood."""

    def __init__(self, x, y, batch_shape: torch.Size):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch_shape))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            lazykern.RBFKernel(ard_num_dims=x.shape[-1], batch_shape=batch_shape), batch_shape=batch_shape)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_a_batch_of_models_trains_each_member_to_its_own_optimum():
    data = [_relevant_two_of(2, 80, seed) for seed in (1, 2)]
    x, y = torch.stack([d[0] for d in data]), torch.stack([d[1] for d in data])
    batch = _BatchGP(x, y, torch.Size([2])).double()
    with settings.engine("torch"):
        log = train(batch, batch.likelihood, iters=300, optimizer="lbfgs", tolerance=1e-7, progress=False)
        alone = []
        for member_x, member_y in data:
            model = _BatchGP(member_x, member_y, torch.Size([])).double()
            alone.append((train(model, model.likelihood, iters=300, optimizer="lbfgs", tolerance=1e-7,
                                progress=False), model))
    assert log.converged, (log.stop_reason, log.interventions, log.iterations)
    assert math.isclose(log[-1], sum(member[-1] for member, _ in alone), rel_tol=1e-4)
    lengthscales = batch.covar_module.base_kernel.lengthscale
    for i, (_, model) in enumerate(alone):  # (to the optimizers' tolerance: the optimum is flat)
        assert torch.allclose(lengthscales[i], model.covar_module.base_kernel.lengthscale[0], rtol=2e-2)
        assert torch.allclose(batch.likelihood.noise[i], model.likelihood.noise[0], rtol=2e-2)


def _loss(model, likelihood) -> float:
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with torch.no_grad(), settings.engine("torch"):
        return -mll(model(*model.train_inputs), model.train_targets).item()


@pytest.mark.parametrize("optimizer, tolerance", [("lbfgs", None), ("adam", 1e-3)])
def test_converged_float32_lbfgs_is_refined_in_float64_and_adam_is_not(optimizer, tolerance, monkeypatch):
    x, y = _relevant_two_of(4, 120, 0)
    model, likelihood = build_model(x.float(), y.float(), "rbf-ard")
    at_switch = []

    def to_float64(m):  # the float64 loss where float32's L-BFGS converged
        regression.to_float64(m)
        at_switch.append(_loss(m, likelihood))

    monkeypatch.setattr(regression.training, "to_float64", to_float64)
    with settings.engine("torch"):
        log = train(model, likelihood, iters=300, optimizer=optimizer, tolerance=tolerance, progress=False)
    assert log.converged and not log.interventions
    if optimizer == "adam":
        assert log.float64_from is None and model.train_inputs[0].dtype == torch.float32 and log.tolerance == 1e-3
        assert at_switch == []
        return
    # float32 converged after float64_from iterations; float64 went on from its best point until it
    # converged again, lower. (float32's own loss there was 8e-4 lower than float64's: at this noise
    # level its rounding of the log determinant is that large.)
    assert log.tolerance == regression.TOLERANCES["lbfgs"] == 1e-6
    assert 0 < log.float64_from < log.iterations <= 300 and log.stop_reason == "loss change below tolerance"
    assert model.train_inputs[0].dtype == model.likelihood.noise.dtype == torch.float64
    assert len(at_switch) == 1 and _loss(model, likelihood) < at_switch[0]


def test_a_failure_while_refining_keeps_float32s_convergence(monkeypatch):
    x, y = _relevant_two_of(4, 120, 0)
    model, likelihood = build_model(x.float(), y.float(), "rbf-ard")
    forward = model.forward

    def failing_in_float64(x):
        if x.dtype == torch.float64:
            raise NotPSDError("not positive definite")
        return forward(x)

    monkeypatch.setattr(model, "forward", failing_in_float64)
    with settings.engine("torch"):
        log = train(model, likelihood, iters=300, progress=False)
    assert (log.converged, log.stop_reason) == (True, "loss change below tolerance")
    assert log.float64_from == log.iterations and len(log.interventions) == 1
    assert log.interventions[0] == (f"NotPSDError at evaluation {len(log) + 1} (float64, refining): stopped at the "
                                    "best hyperparameters evaluated before it")
    monkeypatch.setattr(model, "forward", forward)
    assert _loss(model, likelihood) == pytest.approx(min(log), abs=1e-2)  # float32's best point, in float64


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_running_out_of_iterations_is_not_convergence(optimizer):
    x, y = _relevant_two_of(4, 120, 0)
    model, likelihood = build_model(x, y, "rbf-ard")
    with settings.engine("torch"):
        log = train(model, likelihood, iters=3, optimizer=optimizer, progress=False)
    assert (log.converged, log.stop_reason, log.iterations) == (False, "iteration limit", 3)
    assert log.evaluations == len(log) >= 3


def test_float32_on_the_conjugate_gradient_path_trains_in_float64():
    x, y = _relevant_two_of(4, 60, 0)
    model, likelihood = build_model(x.float(), y.float(), "rbf-ard")
    with settings.engine("torch"), gpytorch.settings.max_cholesky_size(20):
        log = train(model, likelihood, iters=3, progress=False)
    assert log.float64_from == 0 and not log.interventions
    assert model.train_inputs[0].dtype == model.likelihood.noise.dtype == torch.float64


def test_a_float32_factorization_that_fails_continues_in_float64_from_the_best_point():
    # Every point twice and a kernel variance of 1e4 over a noise of 1e-4: float32's rounding of K
    # (1e4 * 6e-8) is larger than the noise that makes K + noise * I positive definite, so the
    # Cholesky factorization fails at the very first evaluation, as OAK's did on keggdirected.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=g).repeat(2, 1)
    y = torch.sin(x[:, 0]) + 0.01 * torch.randn(60, generator=g)
    model, likelihood = build_model(x, (y - y.mean()) / y.std(), "rbf-ard")
    model.covar_module.outputscale = 1e4
    model.covar_module.base_kernel.lengthscale = 30.0
    likelihood.noise = 1e-4
    with settings.engine("torch"):
        log = train(model, likelihood, iters=5, progress=False)
        mean, _ = regression.predict(model, likelihood, x[:4])
    assert log.interventions == ["NotPSDError at evaluation 1 (float32): continued in float64 from the best "
                                 "hyperparameters evaluated before it"]
    assert model.train_inputs[0].dtype == model.likelihood.noise.dtype == mean.dtype == torch.float64
    assert all(math.isfinite(v) for v in log) and log[-1] < log[0]


def test_a_float64_failure_stops_at_the_best_point(monkeypatch):
    x, y = _relevant_two_of(2, 40, 1)
    model, likelihood = build_model(x, y, "rbf-ard")
    calls = {"n": 0}
    forward = model.forward

    def failing_after_three(x):
        calls["n"] += 1
        if calls["n"] > 3:
            raise NotPSDError("not positive definite")
        return forward(x)

    monkeypatch.setattr(model, "forward", failing_after_three)
    with settings.engine("torch"):
        log = train(model, likelihood, iters=50, progress=False)
    best = min(log)
    assert (log.converged, log.stop_reason, len(log)) == (False, "numerical failure", 3)
    assert log.interventions == ["NotPSDError at evaluation 4 (float64): stopped at the best hyperparameters "
                                 "evaluated before it"]
    monkeypatch.setattr(model, "forward", forward)
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with torch.no_grad():
        assert -mll(model(x), y).item() == pytest.approx(best, rel=1e-12)


def test_warm_start_takes_the_subsets_exact_fit_and_keeps_the_data():
    torch.manual_seed(0)
    x = torch.randn(80, 2); y = torch.sin(2 * x).sum(-1)
    model, likelihood = build_model(x, y, "rbf-ard")
    log = warm_start(model, likelihood, 40, iters=30, progress=False, seed=1)
    rows = torch.randperm(80, generator=torch.Generator().manual_seed(1))[:40]
    direct, direct_likelihood = build_model(x[rows], y[rows], "rbf-ard")
    with gpytorch.settings.max_cholesky_size(40):
        direct_log = train(direct, direct_likelihood, iters=30, progress=False, optimizer="lbfgs")
    assert log == direct_log and log.float64_from is not None  # refined in float64, as train does
    for (name, mine), theirs in zip(model.state_dict().items(), direct.state_dict().values()):
        assert mine.dtype == torch.float32 and torch.equal(mine, theirs.float()), name
    assert model.train_inputs[0] is x and torch.equal(model.train_targets, y)
    with pytest.raises(ValueError, match="size must be below the number of training points \\(80\\); got 80"):
        warm_start(model, likelihood, 80)
    with pytest.raises(ValueError, match="likelihood must be the model's own"):
        warm_start(model, gpytorch.likelihoods.GaussianLikelihood(), 40)


def test_ard_scaled_directions_divide_diverse_ones_by_the_subsets_ard_lengthscales():
    torch.manual_seed(0)
    x = torch.randn(120, 3, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) + 0.3 * x[:, 1]
    W = regression.ard_scaled_directions(x, y, 5, size=60, iters=30, progress=False, seed=2)
    model, likelihood = build_model(x, y, "rbf-ard")
    warm_start(model, likelihood, 60, iters=30, progress=False, seed=2)
    lengthscales = model.covar_module.base_kernel.lengthscale.detach().reshape(3, 1)
    expected = diverse_directions(3, 5, 2) / lengthscales
    assert W.dtype == torch.float64 and W.shape == (3, 5)
    torch.testing.assert_close(W, expected, rtol=1e-12, atol=0)
    same, noise = regression.ard_scaled_directions(x, y, 5, size=60, iters=30, progress=False, seed=2,
                                                   return_noise=True)
    assert torch.equal(same, W) and noise == likelihood.noise.item()
    # no more points than the subset's size: the fit is on all of them
    every = regression.ard_scaled_directions(x[:50], y[:50], 5, size=60, iters=30, progress=False)
    model, likelihood = build_model(x[:50], y[:50], "rbf-ard")
    train(model, likelihood, 30, progress=False, optimizer="lbfgs")
    lengthscales = model.covar_module.base_kernel.lengthscale.detach().reshape(3, 1)
    torch.testing.assert_close(every, diverse_directions(3, 5, 0) / lengthscales, rtol=1e-12, atol=0)
    for bad in (0, 2.5):
        with pytest.raises(ValueError, match="num_projections must be a positive int"):
            regression.ard_scaled_directions(x, y, bad, progress=False)


def test_a_noise_floor_bounds_the_noise_the_fit_reaches():
    """Noiseless targets drive the noise to its bound: GPyTorch's 1e-4, or the floor given, which
    training then keeps; a bad floor is refused before anything is built."""
    torch.manual_seed(0)
    x = torch.rand(60, 2, dtype=torch.float64)
    y = torch.sin(4 * x).sum(-1)
    model, likelihood = build_model(x, y, "rbf-ard", noise_floor=0.05)
    # GPyTorch keeps a bound in torch's default dtype (float32), as its own 1e-4
    torch.testing.assert_close(likelihood.noise_covar.raw_noise_constraint.lower_bound.item(), 0.05, rtol=1e-7, atol=0)
    torch.testing.assert_close(likelihood.noise.item(), 0.05 + regression.INITIAL_NOISE, rtol=1e-7, atol=0)
    result = regression.fit_evaluate(x[:50], y[:50], x[50:], y[50:], kernel="rbf-ard", iters=30,
                                     analyze=False, progress=False)
    floored = regression.fit_evaluate(x[:50], y[:50], x[50:], y[50:], kernel="rbf-ard", iters=30,
                                      noise_floor=0.05, analyze=False, progress=False)
    assert result.likelihood.noise.item() < 1e-3
    assert 0.05 <= floored.likelihood.noise.item() < 0.051
    for bad in (0, -1.0, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="noise_floor must be a positive finite number"):
            build_model(x, y, "rbf-ard", noise_floor=bad)


def test_the_ard_noise_floor_is_the_noise_of_ard_scaled_directions_fit():
    """``noise_floor="ard"`` bounds the noise by ARD RBF's on the same points, the fit
    :func:`ard_scaled_directions` starts learned directions from; a misspelt name is refused first."""
    torch.manual_seed(0)
    x = torch.rand(60, 2, dtype=torch.float64)
    y = torch.sin(4 * x[:, 0]) + 0.1 * torch.randn(60, dtype=torch.float64)
    floor = regression.ard_noise_floor(x[:50], y[:50], iters=30, progress=False)
    _, noise = regression.ard_scaled_directions(x[:50], y[:50], 3, iters=30, progress=False, return_noise=True)
    assert floor == noise and 1e-3 < floor < 0.1
    result = regression.fit_evaluate(x[:50], y[:50], x[50:], y[50:], kernel="rbf-ard", iters=30,
                                     noise_floor="ard", analyze=False, progress=False)
    assert result.noise_floor == floor and result.likelihood.noise.item() >= floor
    with pytest.raises(ValueError, match=r"noise_floor must be one of \('ard', 'auto'\), got 'ARD'"):
        regression.fit_evaluate(x[:50], y[:50], x[50:], y[50:], kernel="rbf-ard", noise_floor="ARD", progress=False)


def test_the_recipe_floors_the_noise_of_learned_projections_only():
    """``noise_floor="auto"`` (the default) is ARD's floor for kernels that train their directions,
    by name or as a module, and none for the others; ``None`` asks for none."""
    torch.manual_seed(0)
    x = torch.rand(60, 2, dtype=torch.float64)
    y = torch.sin(4 * x[:, 0]) + 0.1 * torch.randn(60, dtype=torch.float64)
    floor = regression.ard_noise_floor(x[:50], y[:50], iters=5, progress=False)

    def projected(learn: bool) -> gpytorch.kernels.Kernel:
        return gpytorch.kernels.ScaleKernel(lazykern.ProjectedAdditiveKernel(
            lazykern.MaternKernel(nu=2.5), 2, 3, learn_projections=learn))

    for kernel, expected in (("dpa-matern52-learned", floor), (projected(True), floor), ("dpa-matern52", None),
                             (projected(False), None)):
        result = regression.fit_evaluate(x[:50], y[:50], x[50:], y[50:], kernel=kernel, iters=5, analyze=False,
                                         progress=False)
        assert result.noise_floor == expected, kernel
    unfloored = regression.fit_evaluate(x[:50], y[:50], x[50:], y[50:], kernel="dpa-matern52-learned", iters=5,
                                        noise_floor=None, analyze=False, progress=False)
    assert unfloored.noise_floor is None


def test_fit_evaluate_warm_starts_below_the_training_size_on_either_path():
    """The exact path too: a projected kernel's full-size exact steps are the expensive ones, and a
    subset's fit saves some; a subset as large as the training set is no warm start."""
    x = torch.rand(70, 2, dtype=torch.float64); y = torch.sin(4 * x).sum(-1)
    args = (x[:60], y[:60], x[60:], y[60:])
    cg = fit_evaluate(*args, kernel="rbf-ard", iters=3, max_cholesky_size=50, warm_start_size=30, progress=False)
    exact = fit_evaluate(*args, kernel="rbf-ard", iters=3, max_cholesky_size=60, warm_start_size=30, progress=False)
    whole = fit_evaluate(*args, kernel="rbf-ard", iters=3, max_cholesky_size=60, warm_start_size=60, progress=False)
    assert [(r.solver, r.warm_start_size) for r in (cg, exact, whole)] == [
        ("cg", 30), ("cholesky", 30), ("cholesky", None)]
    model, likelihood = build_model(x[:60], y[:60], "rbf-ard")  # by hand: the subset's fit, then all points
    with gpytorch.settings.max_cholesky_size(60):
        warm_start(model, likelihood, 30, iters=3, progress=False)
        train(model, likelihood, iters=3, progress=False)
    assert exact.hyperparameters == regression.hyperparameters(model)
    with pytest.raises(ValueError, match="warm_start_size must be at most max_cholesky_size \\(50\\)"):
        fit_evaluate(*args, kernel="rbf-ard", max_cholesky_size=50, warm_start_size=51, progress=False)


def test_train_rejects_bad_options():
    model, likelihood = build_model(torch.randn(10, 2), torch.randn(10), "rbf-ard")
    with pytest.raises(ValueError, match="optimizer must be one of auto, lbfgs, adam; got 'sgd'"):
        train(model, likelihood, optimizer="sgd")
    with pytest.raises(ValueError, match="tolerance must be a positive finite number, got 0"):
        train(model, likelihood, tolerance=0)
    with pytest.raises(ValueError, match="iters must be a positive int, got 0"):
        train(model, likelihood, iters=0)


def test_recipe_escapes_the_mean_predictor_in_many_dimensions():
    """Two relevant inputs out of 24 (as pumadyn32nm): from GPyTorch's initial values the likelihood
    slides to 'all noise'; from the dimension-aware start it finds the function."""
    x, y = _relevant_two_of(24, 300, 1)
    xt, yt = _relevant_two_of(24, 300, 2)
    with settings.engine("torch"):
        ours = fit_evaluate(x, y, xt, yt, kernel="rbf-ard", max_cholesky_size=1000, progress=False)
        kernel = make_kernel("rbf-ard", 24)  # a module: GPyTorch's initial lengthscales
        model, likelihood = build_model(x, y, kernel)
        likelihood.noise = 0.6931  # and GPyTorch's initial noise
        train(model, likelihood, iters=50, optimizer="adam", progress=False)
        mean, var = regression.predict(model, likelihood, xt)
    defaults_rmse = regression.gaussian_metrics(mean, var, yt)[0]
    assert ours.rmse < 0.5, ours.rmse
    assert defaults_rmse > 0.9, defaults_rmse


@pytest.mark.parametrize("name, kind, orders", [("oak", "sobol", 3), ("additive-ng", "empirical", 3),
                                                ("additive-rbf", "empirical", 1), ("rbf-ard", None, None)])
def test_fit_evaluate_reports_shares_and_plots(name, kind, orders, tmp_path):
    x, y = _relevant_two_of(3, 80, 3)
    with settings.engine("torch"):
        result = fit_evaluate(x, y, x, y, kernel=name, iters=20, max_cholesky_size=100, progress=False)
    record = result.to_dict()
    assert record["analysis_kind"] == kind and record["optimizer"] == "auto" and record["optimizer_used"] == "lbfgs"
    if kind is None:
        assert record["order_shares"] is None and record["total_effects"] is None and result.analysis is None
        return
    assert len(record["order_shares"]) == orders and abs(sum(record["order_shares"]) - 1) < 1e-9
    assert len(record["dimension_shares"]) == 3
    assert record["max_degree"] == (orders if name != "additive-rbf" else None)
    assert len(record["total_effects"]) == 3 and record["total_effects_kind"] is not None
    path = plot_components(result.analysis, tmp_path / "c.png", title=name)
    assert path.stat().st_size > 0


def test_a_float32_prediction_whose_cg_stalls_is_repeated_in_float64_and_said(monkeypatch):
    """linear_operator only warns when CG stops short of its tolerance, and in float32 the mean's
    solve can stall far from it (all of UCI pol, additive RBF: test RMSE 5.49 where float64 gives
    0.54). Here the prediction's CG is asked for a residual no solve reaches: both tries stall, and
    the result says so. Training keeps float32 here, as it does for a model on a GPU (on CPU
    tensors the conjugate-gradient path trains, and so predicts, in float64)."""
    monkeypatch.setattr(regression.training, "trains_in_float64", lambda model: False)
    predict = regression.prediction.predict

    def cut_short(*args):
        with gpytorch.settings.eval_cg_tolerance(1e-20):
            return predict(*args)

    monkeypatch.setattr(regression.prediction, "predict", cut_short)
    x, y = _relevant_two_of(2, 60, 1)
    with settings.engine("torch"):
        result = fit_evaluate(x[:50].float(), y[:50].float(), x[50:].float(), y[50:].float(), kernel="rbf-ard",
                              iters=2, max_cholesky_size=0, analyze=False, progress=False)
    float32, float64 = result.interventions[-2:]
    assert float32.startswith("CG stopped after ") and " at a relative residual of " in float32
    assert float32.endswith(" (tolerance 1e-20) in prediction (float32): predicted in float64")
    assert float64.startswith("CG stopped after ") and float64.endswith(" (tolerance 1e-20) in prediction")
    assert result.computed_dtype == "float64"


def test_variance_bounds_bracket_the_exact_predictive_variance():
    x, y = _relevant_two_of(3, 90, 2)
    model, likelihood = build_model(x[:80], y[:80], "additive-rbf")
    with settings.engine("torch"), gpytorch.settings.max_cholesky_size(0):
        lower, upper = regression.variance_bounds(model, likelihood, x[80:], tolerance=1e-2)
        tight_lower, tight_upper = regression.variance_bounds(model, likelihood, x[80:], tolerance=1e-8)
    with torch.no_grad():  # the formula, densely
        K = model.covar_module(x[:80]).to_dense() + likelihood.noise * torch.eye(80, dtype=x.dtype)
        cross = model.covar_module(x[:80], x[80:]).to_dense()
        exact = model.covar_module(x[80:], diag=True) + likelihood.noise - (cross * torch.linalg.solve(K, cross)).sum(0)
    for low, up in ((lower, upper), (tight_lower, tight_upper)):
        assert bool((low <= exact + 1e-12).all() and (exact <= up + 1e-12).all())
    assert bool((tight_upper - tight_lower < 0.01 * exact).all())
    assert model.training and model.train_inputs[0].dtype == x.dtype  # the model was not touched
    with pytest.raises(ValueError, match="tolerance must be a positive finite number, got 0.0"):
        regression.variance_bounds(model, likelihood, x[80:], tolerance=0.0)


def test_love_variances_a_rank_cannot_resolve_withhold_the_nlpd(monkeypatch):
    """LOVE's rank (100 by default) overestimated the variances of an additive kernel on all of UCI
    elevators 500-fold (NLPD 2.97 against 0.63); here a rank of 2 does it on 60 points. Where LOVE is
    right, the check stops at the first solve whose bounds leave it no room to be off."""
    x, y = _relevant_two_of(2, 70, 3)
    # ARD: a kernel the grid does not model, whose variances on the CG path are LOVE's
    args = dict(kernel="rbf-ard", iters=3, max_cholesky_size=0, analyze=False, progress=False)
    tolerances, bounds = [], regression.prediction.variance_bounds

    def recorded(model, likelihood, x, tolerance):
        tolerances.append(tolerance)
        return bounds(model, likelihood, x, tolerance)

    monkeypatch.setattr(regression.prediction, "variance_bounds", recorded)
    with settings.engine("torch"):
        fine = fit_evaluate(x[:60], y[:60], x[60:], y[60:], **args)
        assert len(tolerances) < len(regression.prediction.VARIANCE_CHECK_SOLVES)  # the 1e-6 solve spared
        with gpytorch.settings.max_root_decomposition_size(2):
            short = fit_evaluate(x[:60], y[:60], x[60:], y[60:], **args)
    assert math.isfinite(fine.nlpd) and not any("LOVE" in note for note in fine.interventions)
    assert math.isnan(short.nlpd) and math.isnan(short.nlpd_original) and math.isfinite(short.rmse)
    assert short.interventions[-1].startswith("LOVE's predictive variances off at ")
    assert short.interventions[-1].endswith("by float64 conjugate gradients): NLPD not reported")


def test_a_recipe_checks_its_options_and_folds_fit_evaluates_keywords():
    """Every option is checked when the recipe is made; ``fit_evaluate``'s keywords become one recipe
    in one place, and beside a recipe they must keep their defaults."""
    Recipe, NoiseFloor = regression.Recipe, regression.NoiseFloor
    with pytest.raises(ValueError, match="iters must be a positive int, got 0"):
        Recipe(iters=0)
    with pytest.raises(ValueError, match="optimizer must be one of auto, lbfgs, adam; got 'sgd'"):
        Recipe(optimizer="sgd")
    with pytest.raises(ValueError, match="warm_start_iters must be a positive int or None, got 0"):
        Recipe(warm_start_iters=0)
    with pytest.raises(ValueError, match=r"warm_start_size must be at most max_cholesky_size \(50\)"):
        Recipe(warm_start_size=51, max_cholesky_size=50)
    with pytest.raises(TypeError, match="noise_floor must be a NoiseFloor"):
        Recipe(noise_floor="ard")
    with pytest.raises(ValueError, match=r"noise_floor must be one of \('ard', 'auto'\), got 'none'"):
        NoiseFloor("none")
    assert Recipe.of(iters=30, noise_floor=None) == Recipe(iters=30, noise_floor=NoiseFloor(None))
    assert Recipe.of(Recipe(iters=30), iters=200, noise_floor="auto") == Recipe(iters=30)
    with pytest.raises(ValueError, match="give iters, noise_floor in the recipe, not beside it"):
        Recipe.of(Recipe(), iters=30, noise_floor=0.1)
    assert (Recipe(iters=7).warm_start_budget, Recipe(iters=7, warm_start_iters=2).warm_start_budget) == (7, 2)
    with gpytorch.settings.max_cholesky_size(123):
        assert Recipe().resolved().max_cholesky_size == 123 and Recipe(max_cholesky_size=5).resolved() == Recipe(
            max_cholesky_size=5)


def test_the_steps_are_fit_evaluate():
    """``fit_evaluate`` is its four steps in turn: the same records, and its flat attributes and
    ``to_dict()`` read from them (read-only)."""
    import dataclasses

    x, y = _relevant_two_of(3, 90, 5)
    recipe = regression.Recipe(iters=15, max_cholesky_size=100)
    with settings.engine("torch"):
        result = fit_evaluate(x[:70], y[:70], x[70:], y[70:], kernel="additive-rbf", recipe=recipe, y_scale=2.0,
                              progress=False)
        model, likelihood, prepared = regression.prepare(x[:70], y[:70], "additive-rbf", recipe)
        fitted = regression.fit(model, likelihood, prepared, progress=False)
        evaluated = regression.evaluate(model, likelihood, prepared, x[70:], y[70:], y_scale=2.0)
        analyzed, analysis = regression.analyze(model, prepared)
    timing = {"floor_seconds", "seconds", "peak_memory_mb"}

    def measured(record):
        return {k: v for k, v in dataclasses.asdict(record).items() if k not in timing}

    for mine, theirs in ((result.prepared, prepared), (result.fitted, fitted), (result.evaluated, evaluated),
                         (result.analyzed, analyzed)):
        assert measured(mine) == measured(theirs)
    assert analysis is not None and result.analysis is not None
    record = result.to_dict()
    assert list(record)[:4] == ["kernel", "n_train", "n_test", "d"] and list(record)[-1] == "component_axes"
    assert (result.rmse, result.order_shares, result.iters) == (evaluated.rmse, analyzed.order_shares, 15)
    assert record["train_seconds"] == result.fitted.seconds + result.prepared.floor_seconds
    assert record["interventions"] == [*result.fitted.interventions, *result.evaluated.interventions]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.rmse = 0.0
    with pytest.raises(AttributeError, match="no attribute 'nosuchfield'"):
        result.nosuchfield


def test_the_warm_start_has_its_own_iteration_budget():
    x = torch.rand(70, 2, dtype=torch.float64); y = torch.sin(4 * x).sum(-1)
    recipe = regression.Recipe(iters=3, warm_start_size=30, warm_start_iters=2, max_cholesky_size=60)
    result = fit_evaluate(x[:60], y[:60], x[60:], y[60:], kernel="rbf-ard", recipe=recipe, progress=False)
    model, likelihood = build_model(x[:60], y[:60], "rbf-ard")  # by hand: 2 iterations on the subset, 3 on all
    with gpytorch.settings.max_cholesky_size(60):
        log = warm_start(model, likelihood, 30, iters=2, progress=False)
        train(model, likelihood, iters=3, progress=False)
    assert log.iterations <= 2 and result.warm_start_size == 30
    assert result.hyperparameters == regression.hyperparameters(model)


def test_the_conjugate_gradient_path_predicts_from_lazykerns_solve(monkeypatch):
    """Above ``max_cholesky_size`` the mean's weights are solved once, by ``lazykern.solvers.cg`` to
    ``eval_cg_tolerance``, which says how it went; ``linear_operator``'s CG does not run, and the
    prediction is the exact one to the solve's tolerance. At most ``max_cholesky_size`` points it is
    GPyTorch's, unchanged."""
    import linear_operator

    x, y = _relevant_two_of(3, 80, 4)
    model, likelihood = build_model(x[:60], y[:60], "rbf-ard")
    with settings.engine("torch"), gpytorch.settings.max_cholesky_size(100):
        exact_mean, _ = regression.predict(model, likelihood, x[60:])
    linear_cg, calls = linear_operator.utils.linear_cg, []
    monkeypatch.setattr(linear_operator.utils, "linear_cg", lambda *a, **k: calls.append(1) or linear_cg(*a, **k))
    solves = []
    with settings.engine("torch"), gpytorch.settings.max_cholesky_size(10), \
            gpytorch.settings.eval_cg_tolerance(1e-10):
        mean, _ = regression.predict(model.train(), likelihood, x[60:], solves.append)
        again, _ = regression.predict(model, likelihood, x[60:], solves.append)  # the weights are kept
    assert calls == [] and len(solves) == 1
    assert solves[0].stalled() is None and solves[0].tolerance == 1e-10 and solves[0].result.iterations > 0
    torch.testing.assert_close(mean, exact_mean, rtol=1e-7, atol=1e-7)
    assert torch.equal(mean, again)
    with settings.engine("torch"), gpytorch.settings.max_cholesky_size(10), \
            gpytorch.settings.eval_cg_tolerance(1e-10), gpytorch.settings.max_cg_iterations(2):
        regression.predict(model.train(), likelihood, x[60:], solves.append)
    assert solves[-1].stalled().startswith("CG stopped after 2 iterations at a relative residual of ")
    assert solves[-1].stalled().endswith(" (tolerance 1e-10)")
