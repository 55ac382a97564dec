r"""Training: one recipe for every kernel, that says how it ended and steps in where the numbers fail.

The loss is :math:`-\frac1n \log p(y \mid X, \theta)`, GPyTorch's
:class:`~gpytorch.mlls.ExactMarginalLogLikelihood` with the cheaper gradient of
:class:`~lazykern.regression.ExactMLL`: exactly by Cholesky up to
``gpytorch.settings.max_cholesky_size`` training points, above by conjugate gradients and stochastic
Lanczos quadrature on lazy matvecs. :func:`train` returns a :class:`TrainingLog`: the loss of every
evaluation (a list, as it always was) with whether training converged, why it stopped, how many
optimizer iterations ran and what the recipe had to do when a factorization failed.

Example:
    >>> import torch
    >>> from lazykern.regression import build_model, train
    >>> model, likelihood = build_model(torch.randn(50, 2), torch.randn(50), "rbf-ard")
    >>> log = train(model, likelihood, iters=3, progress=False)
    >>> log.converged, log.stop_reason
    (False, 'iteration limit')
"""

from __future__ import annotations

import copy
from typing import Callable

import gpytorch
import torch
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from ..kernel_names import OPTIMIZERS, TOLERANCES
from ..kernels.projected import diverse_directions
from ..validation import check_positive_int, check_positive_number
from .likelihood import ExactMLL
from .model import build_model

__all__ = ["ADAM_PLATEAU_WINDOW", "NUMERICAL_FAILURES", "OPTIMIZERS", "TOLERANCES", "TrainingLog",
           "ard_noise_floor", "ard_scaled_directions", "refines_in_float64", "resolve_optimizer", "to_float64", "train",
           "trains_in_float64", "warm_start"]

ADAM_PLATEAU_WINDOW = 30
"""Steps over which Adam's plateau rule (:func:`train`) compares the loss.

A likelihood often creeps across a plateau before the lengthscales of the relevant inputs fall, and a
10-step window took that plateau for convergence. UCI pol, split 0, 3,000 points (conjugate
gradients), 200 steps at most: ARD RBF stopped after 88 steps at test RMSE 0.280 with 10 steps and
ran all 200 to 0.121 with 30 (0.120 with no stop at all; L-BFGS on the exact likelihood 0.112);
Newton–Girard over all orders 0.288 after 71 steps, 0.134 after 200. At 5,000 points with 30 steps:
ARD 0.0958, Newton–Girard 0.0960."""

#: Learning-rate halvings after which Adam's plateau rule stops.
ADAM_HALVINGS = 4

#: What a failed evaluation raises (besides a non-finite loss): a Cholesky factor that does not exist even with GPyTorch's jitter
#: (``NotPSDError``), a kernel matrix with NaN entries (``NanError``), a loss that is not finite.
NUMERICAL_FAILURES = (NotPSDError, NanError)


class _NonFiniteLoss(ArithmeticError):
    pass


class TrainingLog(list):
    """The loss of every evaluation of :func:`train` (a ``list`` of floats), and how training ended.

    Attributes:
        converged: whether the optimizer stopped by its convergence rule (not by running out of
            iterations or evaluations, and not after a numerical failure it could not get past).
        stop_reason: why training stopped, in words: ``"loss change below tolerance"`` (L-BFGS),
            ``"plateau"`` (Adam's plateau rule), ``"iteration limit"``, ``"evaluation limit"``, or
            ``"numerical failure"``.
        iterations: optimizer iterations run (L-BFGS iterations, each one or more evaluations with
            its line search; Adam steps).
        interventions: what the recipe did when an evaluation failed, one sentence each (empty
            when it never had to).
        tolerance: the convergence threshold training used (``tolerance``, or the optimizer's
            default from :data:`~lazykern.kernel_names.TOLERANCES`).
        float64_from: the iteration after which training went on in float64 (a float32 model
            whose L-BFGS converged is refined in float64, and one whose evaluation failed continues
            in it; see :func:`train`), or ``None`` when it stayed in its own dtype.

    Example:
        >>> from lazykern.regression import TrainingLog
        >>> log = TrainingLog([1.0, 0.5], converged=True, stop_reason="plateau", iterations=2)
        >>> log[-1], log.evaluations
        (0.5, 2)
    """

    def __init__(self, losses=(), *, converged: bool = False, stop_reason: str = "", iterations: int = 0,
                 interventions: list[str] | None = None, tolerance: float | None = None,
                 float64_from: int | None = None) -> None:
        super().__init__(losses)
        self.converged = converged
        self.stop_reason = stop_reason
        self.iterations = iterations
        self.interventions = [] if interventions is None else interventions
        self.tolerance = tolerance
        self.float64_from = float64_from

    @property
    def evaluations(self) -> int:
        """The number of loss evaluations; L-BFGS counts every evaluation, its line search's included."""
        return len(self)


def resolve_optimizer(optimizer: str, n_train: int) -> str:
    """The optimizer :func:`train` runs: ``"auto"`` resolved by whether the likelihood is exact.

    Example:
        >>> from lazykern.regression import resolve_optimizer
        >>> resolve_optimizer("auto", 500), resolve_optimizer("auto", 10**6)
        ('lbfgs', 'adam')
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {optimizer!r}")
    if optimizer != "auto":
        return optimizer
    return "adam" if _on_conjugate_gradients(n_train) else "lbfgs"


def _on_conjugate_gradients(n_train: int) -> bool:
    """Whether GPyTorch computes the likelihood of ``n_train`` points by conjugate gradients
    rather than Cholesky (more than ``gpytorch.settings.max_cholesky_size``)."""
    return n_train > gpytorch.settings.max_cholesky_size.value()


def train(
    model: gpytorch.models.ExactGP,
    likelihood: gpytorch.likelihoods.Likelihood,
    iters: int = 200,
    lr: float | None = None,
    progress: bool = True,
    *,
    optimizer: str = "auto",
    tolerance: float | None = None,
) -> TrainingLog:
    r"""Maximize the exact marginal log likelihood until it converges; returns a :class:`TrainingLog`.

    * ``"lbfgs"``: L-BFGS (history 10) with a strong-Wolfe line search, at most ``iters``
      iterations and ``2 iters`` loss evaluations; converged when the loss changes by less than
      ``tolerance`` between iterations (or the step or gradient vanishes). **A float32 model is
      refined in float64**: when its L-BFGS converges with iterations left, the model and its
      training data move to float64 and L-BFGS goes on from the best point until it converges
      again. float32 rounding of the loss and its gradient can end the line search before the
      optimum: on UCI pumadyn32nm (split 0, 1,500 points, Newton–Girard) float32 stopped at a loss
      of -0.0475 (test RMSE 0.221) and float64 went on to -0.0543 (0.219) in 30 more iterations;
      where float32 had converged, float64 ends within a few iterations. A failure while refining
      stops at the best float64 point and keeps float32's convergence (said in ``interventions``).
    * ``"adam"``: Adam; whenever the loss improved by less than ``tolerance`` per step over the
      last :data:`ADAM_PLATEAU_WINDOW` (30) steps, the learning rate is halved; converged at the
      fifth such plateau.
    * **A float32 model on CPU tensors trains in float64 on the conjugate-gradient path**
      (:func:`trains_in_float64`): there preconditioned CG stalls in float32 (``float64_from`` is 0).
    * ``"auto"``: L-BFGS when the likelihood is exact, Adam when it is stochastic (a line search
      needs a deterministic objective). Measured on a 4-dimensional toy problem (120 points,
      float64): L-BFGS converged in 35 loss evaluations to -0.617; Adam at lr 0.1 was at -0.553
      after 2,000 steps and still improving (``benchmarks/recipe.py`` measures both on UCI data).

    **When an evaluation fails** (no Cholesky factor even with GPyTorch's jitter, NaN entries, a
    loss that is not finite), training is not lost: the hyperparameters go back to the best point
    evaluated so far (the initial ones if none succeeded) and, for a float32 model, the model and its
    training data move to float64 and training continues with the iterations left. That is the cause
    on UCI data: float32 rounding of a kernel whose variance is large against the noise (an additive
    offset of variance 17 over noise 4e-4 on bike: condition number beyond float32's 1e7), and the
    cancellation of OAK's high-order terms (keggdirected, split 1: not positive definite at the
    recipe's starting point in float32, fine in float64). A float64 model that fails stops at the
    best point, with ``stop_reason`` ``"numerical failure"``. Each step taken is said in
    ``interventions``; a run that never fails is not changed at all.

    **A batch of models** (``batch_shape`` ``(b,)``: b independent GPs) trains on the sum of its
    members' losses, as BoTorch's ``fit_gpytorch_mll`` does: each member's hyperparameters get
    their own loss's gradient, and the log and ``tolerance`` see the sum.

    Args:
        model: an exact GP holding its training data (with a batch shape or without).
        likelihood: its likelihood.
        iters: most optimizer iterations.
        lr: initial step: default 1 for L-BFGS (the line search adapts it), 0.1 for Adam.
        progress: show a tqdm progress bar (on stderr) counting optimizer iterations, with the best
            loss so far.
        optimizer: one of :data:`OPTIMIZERS`.
        tolerance: convergence threshold on the loss (nats per training point); default: the
            optimizer's, :data:`~lazykern.kernel_names.TOLERANCES` (L-BFGS 1e-6, Adam 1e-4).

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, train
        >>> _ = torch.manual_seed(0)  # noise data: from some draws L-BFGS needs more than 30 iterations
        >>> model, likelihood = build_model(torch.randn(50, 2), torch.randn(50), "rbf-ard")
        >>> log = train(model, likelihood, iters=100, progress=False)
        >>> log.converged, log.iterations <= 100, log[-1] <= log[0]
        (True, True, True)
    """
    from tqdm.auto import tqdm

    check_positive_int("iters", iters)
    if lr is not None:
        check_positive_number("lr", lr)
    if tolerance is not None:
        check_positive_number("tolerance", tolerance)
    optimizer = resolve_optimizer(optimizer, model.train_inputs[0].shape[-2])
    tolerance = TOLERANCES[optimizer] if tolerance is None else tolerance
    model.train()
    likelihood.train()
    mll = ExactMLL(likelihood, model)
    log = TrainingLog(tolerance=tolerance)
    if trains_in_float64(model):
        to_float64(model)
        log.float64_from = 0
    best = _Best(model)

    def objective() -> Tensor:
        loss = -mll(model(*model.train_inputs), model.train_targets).sum()  # a batch's members are independent
        if not torch.isfinite(loss):
            raise _NonFiniteLoss(f"loss {loss.item()}")
        log.append(loss.item())
        best.offer(log[-1])
        return loss

    refining = False  # in float64 after float32's L-BFGS converged
    evaluations = 2 * iters  # L-BFGS's budget, over every stage together
    with tqdm(total=iters, desc=f"training ({optimizer})", disable=not progress, leave=False) as bar:
        while True:
            parameters = [p for p in model.parameters() if p.requires_grad]
            left = iters - log.iterations
            try:
                if optimizer == "lbfgs":
                    _lbfgs(log, parameters, objective, left, evaluations - len(log), lr, tolerance, bar, best)
                else:
                    _adam(log, parameters, objective, left, lr, tolerance, bar)
            except (*NUMERICAL_FAILURES, _NonFiniteLoss) as err:
                failure = f"{type(err).__name__} at evaluation {len(log) + 1}"
                best.restore()
                if refining:  # float32 had converged: that result stands, refined as far as float64 got
                    log.interventions.append(f"{failure} (float64, refining): stopped at the best hyperparameters "
                                             "evaluated before it")
                    log.converged, log.stop_reason = True, "loss change below tolerance"
                    break
                spent = log.iterations >= iters or (optimizer == "lbfgs" and len(log) >= evaluations)
                if _dtype(model) != torch.float32 or spent:
                    log.interventions.append(f"{failure} ({_dtype_name(model)}): stopped at the best hyperparameters "
                                             "evaluated before it")
                    log.converged, log.stop_reason = False, "numerical failure"
                    break
                log.interventions.append(f"{failure} (float32): continued in float64 from the best hyperparameters "
                                         "evaluated before it")
            else:
                if not (log.converged and refines_in_float64(_dtype(model), optimizer)):
                    break
                best.restore()
                refining = True
            to_float64(model)
            best.reset()  # float32's losses read low against float64's: the float64 stage keeps its own best
            log.float64_from = log.iterations
    return log


def warm_start(
    model: gpytorch.models.ExactGP,
    likelihood: gpytorch.likelihoods.Likelihood,
    size: int,
    iters: int = 200,
    progress: bool = True,
    *,
    seed: int = 0,
) -> TrainingLog:
    r"""Fit the hyperparameters exactly on a random subset of ``size`` training points; ``model`` takes them.

    A copy of the model on the subset is trained by :func:`train` with L-BFGS on the exact
    (Cholesky) likelihood, refined in float64 as :func:`train` does; the model and its likelihood
    then take its hyperparameters and keep their own training data and dtype. Training on all
    points (conjugate gradients and Adam, or exactly) goes on from there, as large exact GPs are
    trained from a subset's hyperparameters (Wang et al., "Exact Gaussian processes on a million data
    points", NeurIPS 2019). Adam from the recipe's start can end far from where L-BFGS on the exact
    likelihood does: UCI split 0, 5,000 training points, ``dpa-matern52`` on the conjugate-gradient
    path, test RMSE from the recipe's start / from a 1,000-point warm start: kin40k 0.992 / 0.797,
    protein 1.067 / 0.738, elevators 0.476 / 0.375 (ARD RBF, exact: 0.149, 0.643, 0.380; the
    measurements in ``docs/projected.rst``).

    Args:
        model: an exact GP holding its training data (more than ``size`` points).
        likelihood: its likelihood (``model.likelihood``).
        size: number of training points of the subset, drawn without replacement.
        iters: most L-BFGS iterations (see :func:`train`).
        progress: show :func:`train`'s progress bar.
        seed: seed of the subset's draw.

    Returns:
        the subset's :class:`TrainingLog`.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, warm_start
        >>> x = torch.randn(300, 2, dtype=torch.float64); y = torch.sin(2 * x).sum(-1)
        >>> model, likelihood = build_model(x, y, "rbf-ard")
        >>> log = warm_start(model, likelihood, 100, iters=50, progress=False)
        >>> log.converged, model.train_inputs[0].shape[0], likelihood.noise.item() < 0.01
        (True, 300, True)
    """
    check_positive_int("size", size)
    n = model.train_inputs[0].shape[-2]
    if size >= n:
        raise ValueError(f"size must be below the number of training points ({n}); got {size}")
    if likelihood is not model.likelihood:
        raise ValueError("likelihood must be the model's own (model.likelihood)")
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(n, generator=generator)[:size].to(model.train_targets.device)
    subset = copy.deepcopy(model)
    subset.set_train_data(tuple(x[..., rows, :] for x in model.train_inputs), model.train_targets[..., rows],
                          strict=False)
    with gpytorch.settings.max_cholesky_size(size):
        log = train(subset, subset.likelihood, iters=iters, progress=progress, optimizer="lbfgs")
    model.load_state_dict(subset.state_dict())  # copy_ casts float64 refinements back to the model's dtype
    return log


def ard_scaled_directions(
    train_x: Tensor,
    train_y: Tensor,
    num_projections: int,
    size: int = 1000,
    iters: int = 200,
    progress: bool = True,
    *,
    seed: int = 0,
    return_noise: bool = False,
) -> Tensor | tuple[Tensor, float]:
    r"""Diverse directions divided by the lengthscales ARD RBF fits exactly: :math:`w_j = \Lambda^{-1}
    u_j`, :math:`\Lambda = \operatorname{diag}(\ell)`, a ``(d, num_projections)`` tensor to start
    learned directions from (``ProjectedAdditiveKernel(..., projections=W, learn_projections=True)``).

    :math:`u_j` are :func:`~lazykern.kernels.projected.diverse_directions` (``seed``) and
    :math:`\ell` the lengthscales of the named ``rbf-ard`` kernel trained by :func:`train` (L-BFGS,
    Cholesky) on a random subset of ``size`` points (:func:`warm_start`, ``seed``), or on all of
    them where there are no more. Each projection then starts as :math:`u_j^\top \Lambda^{-1} x`,
    the recipe's input lengthscales at ARD's values. On UCI pol (split 0, 5,000 points, Matérn-5/2
    base, learned on all points) from DPA's directions / from these: test RMSE 0.202 / 0.122 with
    52 projections, 0.0936 with 208 against ARD RBF's 0.097; on protein at 1,200 points (18
    projections) 0.884 / 0.929, both overfitting (``docs/projected.rst``).

    Args:
        train_x: ``(n, d)`` training inputs.
        train_y: ``(n,)`` training targets.
        num_projections: number of directions J.
        size: points of ARD's exact fit.
        iters: most L-BFGS iterations of that fit.
        progress: show :func:`train`'s progress bar.
        seed: seed of the subset's draw and of the directions.
        return_noise: also return the noise variance of ARD's fit, a floor for the learned directions'
            (:func:`build_model`'s ``noise_floor``), which otherwise can explain the noise.

    Returns:
        a ``(d, num_projections)`` tensor in ``train_x``'s dtype and on its device; with ``return_noise``,
        that tensor and the noise variance (a float).

    Example:
        >>> import torch
        >>> from lazykern import ProjectedAdditiveKernel, MaternKernel
        >>> from lazykern.regression import ard_scaled_directions, build_model
        >>> x = torch.randn(300, 3, dtype=torch.float64); y = torch.sin(3 * x[:, 0]) + 0.1 * x[:, 1]
        >>> W = ard_scaled_directions(x, y, 6, size=100, iters=50, progress=False)
        >>> kernel = ProjectedAdditiveKernel(MaternKernel(nu=2.5), 3, 6, projections=W, learn_projections=True)
        >>> W.shape, bool(W[0].norm() > W[2].norm())   # y does not depend on x_2: a long lengthscale
        (torch.Size([3, 6]), True)
        >>> W, noise = ard_scaled_directions(x, y, 6, size=100, iters=50, progress=False, return_noise=True)
        >>> model, likelihood = build_model(x, y, kernel, noise_floor=noise)   # noise at least ARD's
    """
    check_positive_int("num_projections", num_projections)
    model, likelihood = _fit_ard(train_x, train_y, size, iters, progress, seed)
    lengthscales = model.covar_module.base_kernel.lengthscale.detach().reshape(-1, 1)
    directions = (diverse_directions(train_x.shape[1], num_projections, seed) / lengthscales).to(train_x)
    return (directions, likelihood.noise.item()) if return_noise else directions


def ard_noise_floor(
    train_x: Tensor, train_y: Tensor, size: int = 1000, iters: int = 200, progress: bool = True, *, seed: int = 0
) -> float:
    r"""The noise variance ARD RBF fits exactly on ``size`` of the points: a lower bound for the noise of
    a kernel that can explain the noise (:func:`build_model`'s ``noise_floor``), such as learned
    projections, measured by a simpler model on the same data. ``fit_evaluate(noise_floor="ard")`` and
    ``lazykern uci --noise-floor ard`` use it, and by default for kernels that train their directions.

    The fit is that of :func:`ard_scaled_directions` (the named ``rbf-ard`` kernel, L-BFGS, Cholesky, on
    a random subset of ``size`` points drawn with ``seed``, or on all of them where there are no more).
    On UCI split 0 at 1,000 points the named ``dpa-matern52-learned`` kernel with this floor reached test
    RMSE 0.326 on kin40k (J = 16; 0.345 without) and 0.223 on pol (J = 52; 0.260 without, and test NLPD
    3.1 against 24.1) (``docs/projected.rst``).

    Args:
        train_x: ``(n, d)`` training inputs.
        train_y: ``(n,)`` training targets.
        size: points of ARD's exact fit.
        iters: most L-BFGS iterations of that fit.
        progress: show :func:`train`'s progress bar.
        seed: seed of the subset's draw.

    Returns:
        the noise variance, a float in the units of ``train_y`` squared.

    Example:
        >>> import torch
        >>> from lazykern.regression import ard_noise_floor
        >>> _ = torch.manual_seed(0)
        >>> x = torch.rand(200, 2, dtype=torch.float64); y = torch.sin(4 * x[:, 0]) + 0.1 * torch.randn(200)
        >>> floor = ard_noise_floor(x, y, size=100, iters=50, progress=False)
        >>> 0.001 < floor < 0.1   # the noise's variance is 0.01
        True
    """
    return _fit_ard(train_x, train_y, size, iters, progress, seed)[1].noise.item()


def _fit_ard(train_x: Tensor, train_y: Tensor, size: int, iters: int, progress: bool, seed: int):
    """The named ``rbf-ard`` model and likelihood trained exactly on ``size`` of the points (all, if no more)."""
    check_positive_int("size", size)
    model, likelihood = build_model(train_x, train_y, "rbf-ard")
    if size < train_x.shape[0]:
        warm_start(model, likelihood, size, iters, progress, seed=seed)
    else:
        with gpytorch.settings.max_cholesky_size(train_x.shape[0]):
            train(model, likelihood, iters, progress=progress, optimizer="lbfgs")
    return model, likelihood


def trains_in_float64(model: gpytorch.models.ExactGP) -> bool:
    r"""Whether :func:`train` moves ``model`` to float64 before its first step: a float32 model on
    CPU tensors whose likelihood is computed by conjugate gradients (more training points than
    ``gpytorch.settings.max_cholesky_size``).

    ``linear_operator``'s preconditioned conjugate gradients stall in float32. On UCI kin40k (split 0,
    5,000 points, ``dpa-matern52`` with 64 projections, at the hyperparameters of a 1,000-point warm
    start, Intel Xeon, one thread) a step with the default rank-15 pivoted-Cholesky preconditioner
    ran all 1,000 iterations and ended at a relative residual of 1.9 (the tolerance: 1), 21 s; the
    same solve on the matrix stored densely also stalled, at 0.02 against a tolerance of 0.01. In
    float64 the step converged at tolerance 0.01 in 0.8 s, its loss 0.732 against the exact 0.726.
    Whole runs of :func:`~lazykern.regression.fit_evaluate` from that warm start (at most 200 Adam
    steps, one thread, each beside one other job): float32 trained in 1,558 s, 33 of its solves
    stalled, test RMSE 0.459; float64 in 475 s, none stalled, 0.478. On CPUs float64 costs little
    more per step, as the structured engine sums in float64 anyway: a step on all 36,000 of kin40k's
    points took 1.9 s against 1.6 s. Models on a GPU keep their dtype: float64
    runs at a fraction of float32's speed on most GPUs, and this has not been measured there.

    Example:
        >>> import gpytorch, torch
        >>> from lazykern.regression import build_model, trains_in_float64
        >>> model, _ = build_model(torch.randn(50, 2), torch.randn(50), "rbf-ard")
        >>> trains_in_float64(model)   # 50 points: Cholesky
        False
        >>> with gpytorch.settings.max_cholesky_size(10):
        ...     trains_in_float64(model)
        True
    """
    x = model.train_inputs[0]
    return x.dtype == torch.float32 and x.device.type == "cpu" and _on_conjugate_gradients(x.shape[-2])


def refines_in_float64(dtype: torch.dtype, optimizer: str) -> bool:
    """Whether :func:`train` refines a model of ``dtype`` in float64 once ``optimizer`` (resolved,
    ``"lbfgs"`` or ``"adam"``) has converged: float32 models trained by L-BFGS.

    Example:
        >>> import torch
        >>> from lazykern.regression import refines_in_float64
        >>> refines_in_float64(torch.float32, "lbfgs"), refines_in_float64(torch.float32, "adam")
        (True, False)
    """
    return dtype == torch.float32 and optimizer == "lbfgs"


class _Best:
    """The model's state at its lowest loss so far (parameters only: a few kilobytes)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        """Start over from the model's current state (after a change of dtype)."""
        self.loss, self.state = float("inf"), copy.deepcopy(self.model.state_dict())

    def offer(self, loss: float) -> None:
        if loss < self.loss:
            self.loss, self.state = loss, copy.deepcopy(self.model.state_dict())

    def restore(self) -> None:
        self.model.load_state_dict(self.state)


def _dtype(model: torch.nn.Module) -> torch.dtype:
    return model.train_inputs[0].dtype


def _dtype_name(model: torch.nn.Module) -> str:
    return str(_dtype(model)).removeprefix("torch.")


def to_float64(model: gpytorch.models.ExactGP) -> None:
    """Move an exact GP, its likelihood and its training data to float64; the hyperparameters keep their values.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, to_float64
        >>> model, _ = build_model(torch.randn(20, 2), torch.randn(20), "rbf-ard")
        >>> to_float64(model)
        >>> model.train_inputs[0].dtype, model.likelihood.noise.dtype
        (torch.float64, torch.float64)
    """
    model.double()
    model.set_train_data(tuple(x.double() for x in model.train_inputs), model.train_targets.double(), strict=False)


def _lbfgs(log: TrainingLog, parameters: list[Tensor], objective: Callable[[], Tensor], iters: int, evaluations: int,
           lr: float | None, tolerance: float, bar, best: _Best) -> None:
    opt = torch.optim.LBFGS(parameters, lr=1.0 if lr is None else lr, max_iter=iters, max_eval=evaluations,
                            tolerance_change=tolerance, tolerance_grad=1e-7, history_size=10,
                            line_search_fn="strong_wolfe")
    done = log.iterations

    def closure() -> Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        # L-BFGS counts its iterations before it evaluates them: the bar moves per iteration, and
        # shows the best loss, not the line search's trial points.
        log.iterations = done + opt.state[parameters[0]]["n_iter"]
        bar.update(log.iterations - bar.n)
        bar.set_postfix(best=f"{best.loss:.4f}")
        return loss

    try:
        opt.step(closure)
    finally:
        state = opt.state[parameters[0]]
        log.iterations = done + state.get("n_iter", 0)
    if state["n_iter"] >= iters:
        log.converged, log.stop_reason = False, "iteration limit"
    elif state["func_evals"] >= evaluations:
        log.converged, log.stop_reason = False, "evaluation limit"
    else:
        log.converged, log.stop_reason = True, "loss change below tolerance"


def _adam(log: TrainingLog, parameters: list[Tensor], objective: Callable[[], Tensor], iters: int, lr: float | None,
          tolerance: float, bar) -> None:
    opt = torch.optim.Adam(parameters, lr=0.1 if lr is None else lr)
    halvings, since, window = 0, 0, ADAM_PLATEAU_WINDOW
    log.converged, log.stop_reason = False, "iteration limit"
    for step in range(iters):
        opt.zero_grad()
        objective().backward()
        opt.step()
        log.iterations += 1
        bar.update()
        bar.set_postfix(loss=f"{log[-1]:.4f}")
        # Plateau: the loss improved by less than `tolerance` per step over the last window
        # (a window, because the stochastic CG loss is noisy from step to step).
        if step - since >= window and log[-window - 1] - log[-1] < tolerance * window:
            if halvings == ADAM_HALVINGS:
                log.converged, log.stop_reason = True, "plateau"
                return
            halvings, since = halvings + 1, step
            for group in opt.param_groups:
                group["lr"] /= 2
