r"""Training: the optimizer loop of one recipe for every kernel, that says how it ended and steps
in where the numbers fail.

The loss is :math:`-\frac1n \log p(y \mid X, \theta)`, GPyTorch's
:class:`~gpytorch.mlls.ExactMarginalLogLikelihood` with the cheaper gradient of
:class:`~lazykern.regression.ExactMLL`: exactly by Cholesky up to
``gpytorch.settings.max_cholesky_size`` training points, above by conjugate gradients and stochastic
Lanczos quadrature on lazy matvecs. :func:`train` returns a :class:`TrainingLog`: the loss of every
evaluation (a list, as it always was) with whether training converged, why it stopped, how many
optimizer iterations ran and what the recipe had to do when a factorization failed. Where training
starts (a subset's exact fit) is chosen in :mod:`lazykern.regression.selection`.

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
from ..validation import check_positive_int, check_positive_number
from .likelihood import ExactMLL
from .progress import JobProgress, progress_bar

__all__ = ["ADAM_PLATEAU_WINDOW", "NUMERICAL_FAILURES", "OPTIMIZERS", "TOLERANCES", "TrainingLog", "check_optimizer",
           "on_conjugate_gradients", "refines_in_float64", "resolve_optimizer", "to_float64", "train",
           "trains_in_float64"]

ADAM_PLATEAU_WINDOW = 30
"""Steps over which Adam's plateau rule (:func:`train`) compares the loss.

A likelihood often creeps across a plateau before the lengthscales of the relevant inputs fall, and
a shorter window takes that plateau for convergence; a window of 30 steps lets it pass
(``docs/interactions.rst`` has the runs that chose it)."""

#: Learning-rate halvings after which Adam's plateau rule stops.
ADAM_HALVINGS = 4

#: What a failed evaluation raises (besides a non-finite loss): a Cholesky factor that does not exist
#: even with GPyTorch's jitter (``NotPSDError``), a kernel matrix with NaN entries (``NanError``).
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
    if check_optimizer(optimizer) != "auto":
        return optimizer
    return "adam" if on_conjugate_gradients(n_train) else "lbfgs"


def check_optimizer(optimizer: object) -> str:
    """``optimizer`` must be one of :data:`~lazykern.regression.OPTIMIZERS`; returns it.

    Example:
        >>> from lazykern.regression.training import check_optimizer
        >>> check_optimizer("sgd")
        Traceback (most recent call last):
        ValueError: optimizer must be one of auto, lbfgs, adam; got 'sgd'
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {optimizer!r}")
    return optimizer


def on_conjugate_gradients(n_train: int) -> bool:
    """Whether GPyTorch solves with the kernel matrix of ``n_train`` points by conjugate gradients
    rather than Cholesky: more than ``gpytorch.settings.max_cholesky_size`` points, above which a
    dense factor costs too much.

    Example:
        >>> import gpytorch
        >>> from lazykern.regression.training import on_conjugate_gradients
        >>> with gpytorch.settings.max_cholesky_size(100):
        ...     on_conjugate_gradients(100), on_conjugate_gradients(101)
        (False, True)
    """
    return n_train > gpytorch.settings.max_cholesky_size.value()


def train(
    model: gpytorch.models.ExactGP,
    likelihood: gpytorch.likelihoods.Likelihood,
    iters: int = 200,
    lr: float | None = None,
    progress: bool | JobProgress = True,
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
      again, because float32 rounding of the loss and its gradient can end the line search before
      the optimum (``docs/uci.rst``, "Training to convergence"). A failure while refining stops at
      the best float64 point and keeps float32's convergence (said in ``interventions``).
    * ``"adam"``: Adam; whenever the loss improved by less than ``tolerance`` per step over the
      last :data:`ADAM_PLATEAU_WINDOW` steps, the learning rate is halved; converged at the
      fifth such plateau.
    * **A float32 model on CPU tensors trains in float64 on the conjugate-gradient path**
      (:func:`trains_in_float64`): there preconditioned CG stalls in float32 (``float64_from`` is 0).
    * ``"auto"``: L-BFGS when the likelihood is exact, Adam when it is stochastic (a line search
      needs a deterministic objective).

    **When an evaluation fails** (no Cholesky factor even with GPyTorch's jitter, NaN entries, a
    loss that is not finite), training is not lost: the hyperparameters go back to the best point
    evaluated so far (the initial ones if none succeeded) and, for a float32 model, the model and its
    training data move to float64 and training continues with the iterations left: float32 rounding
    of a kernel matrix whose variance is large against the noise is the cause on UCI data
    (``docs/uci.rst``, "Training that does not fail"). A float64 model that fails stops at the best
    point, with ``stop_reason`` ``"numerical failure"``. Each step taken is said in
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
            loss so far; or the :class:`~lazykern.regression.progress.JobProgress` of a whole job, whose
            current phase the iterations count in.
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
    optimizer, tolerance = _checked_options(model, iters, lr, optimizer, tolerance)
    model.train()
    likelihood.train()
    log = TrainingLog(tolerance=tolerance)
    if trains_in_float64(model):
        to_float64(model)
        log.float64_from = 0
    best = _Best(model)
    objective = _objective(model, ExactMLL(likelihood, model), log, best)
    with progress_bar(progress, iters, f"training ({optimizer})") as bar:
        _run_stages(model, log, best, objective, optimizer, iters, lr, tolerance, bar)
    return log


def _run_stages(model: gpytorch.models.ExactGP, log: TrainingLog, best: "_Best", objective: Callable[[], Tensor],
                optimizer: str, iters: int, lr: float | None, tolerance: float, bar) -> None:
    """Run the optimizer in the model's dtype, then again in float64 from the best point after a
    failure (:func:`_float64_fallback`) or after a float32 L-BFGS converged (the refinement), until
    a stage ends with nothing left to step in for."""
    refining = False  # in float64 after float32's L-BFGS converged
    evaluations = 2 * iters  # L-BFGS's budget, over every stage together
    while True:
        parameters = [p for p in model.parameters() if p.requires_grad]
        left = iters - log.iterations
        try:
            if optimizer == "lbfgs":
                _lbfgs(log, parameters, objective, left, evaluations - len(log), lr, tolerance, bar, best)
            else:
                _adam(log, parameters, objective, left, lr, tolerance, bar)
        except (*NUMERICAL_FAILURES, _NonFiniteLoss) as err:
            spent = log.iterations >= iters or (optimizer == "lbfgs" and len(log) >= evaluations)
            if not _float64_fallback(model, log, best, err, refining=refining, spent=spent):
                return
        else:
            if not (log.converged and refines_in_float64(_dtype(model), optimizer)):
                return
            best.restore()
            refining = True
        to_float64(model)
        best.reset()  # float32's losses read low against float64's: the float64 stage keeps its own best
        log.float64_from = log.iterations


def _checked_options(model: gpytorch.models.ExactGP, iters: int, lr: float | None, optimizer: str,
                     tolerance: float | None) -> tuple[str, float]:
    """The optimizer :func:`train` runs and its tolerance, after checking ``train``'s options."""
    check_positive_int("iters", iters)
    if lr is not None:
        check_positive_number("lr", lr)
    if tolerance is not None:
        check_positive_number("tolerance", tolerance)
    optimizer = resolve_optimizer(optimizer, model.train_inputs[0].shape[-2])
    return optimizer, TOLERANCES[optimizer] if tolerance is None else tolerance


def _objective(model: gpytorch.models.ExactGP, mll: ExactMLL, log: TrainingLog, best: "_Best") -> Callable[[], Tensor]:
    """The loss :func:`train` minimizes, logged and offered to ``best`` at every evaluation."""

    def objective() -> Tensor:
        loss = -mll(model(*model.train_inputs), model.train_targets).sum()  # a batch's members are independent
        if not torch.isfinite(loss):
            raise _NonFiniteLoss(f"loss {loss.item()}")
        log.append(loss.item())
        best.offer(log[-1])
        return loss

    return objective


def _float64_fallback(model: gpytorch.models.ExactGP, log: TrainingLog, best: "_Best", err: Exception, *,
                      refining: bool, spent: bool) -> bool:
    """After a failed evaluation: back to the best hyperparameters evaluated so far, and whether
    training goes on in float64 (a float32 model with iterations left); said in ``log`` either way."""
    failure = f"{type(err).__name__} at evaluation {len(log) + 1}"
    best.restore()
    if refining:  # float32 had converged: that result stands, refined as far as float64 got
        log.interventions.append(f"{failure} (float64, refining): stopped at the best hyperparameters "
                                 "evaluated before it")
        log.converged, log.stop_reason = True, "loss change below tolerance"
        return False
    if _dtype(model) != torch.float32 or spent:
        log.interventions.append(f"{failure} ({_dtype_name(model)}): stopped at the best hyperparameters "
                                 "evaluated before it")
        log.converged, log.stop_reason = False, "numerical failure"
        return False
    log.interventions.append(f"{failure} (float32): continued in float64 from the best hyperparameters "
                             "evaluated before it")
    return True


def trains_in_float64(model: gpytorch.models.ExactGP) -> bool:
    r"""Whether :func:`train` moves ``model`` to float64 before its first step: a float32 model on
    CPU tensors whose likelihood is computed by conjugate gradients (more training points than
    ``gpytorch.settings.max_cholesky_size``).

    ``linear_operator``'s preconditioned conjugate gradients stall in float32: a stalled solve runs
    to its iteration limit and gives a loss and gradient far from the exact ones, where float64
    converges in a few iterations (``docs/uci.rst``, "The recipe's choices").
    On CPUs float64 costs little more per step, the structured engine summing in float64 anyway;
    models on a GPU keep their dtype, where float64 runs at a fraction of float32's speed.

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
    return x.dtype == torch.float32 and x.device.type == "cpu" and on_conjugate_gradients(x.shape[-2])


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
