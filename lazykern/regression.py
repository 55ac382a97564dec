r"""Exact GP regression with lazy kernels: build, train, predict, score.

The one implementation behind ``lazykern uci``, ``lazykern demo``, the examples and the UCI
benchmark. The model is GPyTorch's standard exact GP,

.. math::

    y = f(x) + \varepsilon, \quad f \sim \mathcal{GP}(c, s\,k), \quad \varepsilon \sim \mathcal N(0, \sigma^2),

with a constant mean :math:`c`, an output scale :math:`s` (``ScaleKernel``; the interaction kernels
carry one variance per order instead), a Gaussian likelihood, and all hyperparameters trained on
the exact marginal log likelihood by one recipe for every kernel (:func:`train`):

* **dimension-aware initialization** (:func:`initialize`): a kernel term that multiplies
  :math:`w` standardized dimensions starts at lengthscale :math:`\sqrt w` (the ARD kernels
  :math:`\sqrt d`, an interaction kernel :math:`\sqrt R`, a first-order additive kernel 1). A
  squared distance between standardized points is about :math:`2 w`, so every term starts near
  :math:`e^{-1}`; GPyTorch's default lengthscale 0.69 makes an ARD kernel in 32 dimensions start
  at :math:`e^{-66}` between any two points, where the likelihood has no slope but towards "all
  noise" (the mean predictor that pumadyn32nm ended at). BoTorch's dimension-scaled lengthscale
  prior (Hvarfner et al., 2024) rests on the same observation. The noise variance starts low
  (:data:`INITIAL_NOISE`), so that the first steps fit the data instead of declaring it noise;
* **an optimizer that stops when converged**: L-BFGS with a strong-Wolfe line search while the
  likelihood is exact (Cholesky, up to ``gpytorch.settings.max_cholesky_size`` points), Adam with
  a plateau schedule on the stochastic conjugate-gradient path, both stopping when the loss stops
  improving (``tolerance``) or after ``iters`` steps.

Example:
    >>> import torch
    >>> from lazykern import regression
    >>> x = torch.rand(200, 3, dtype=torch.float64)
    >>> y = torch.sin(6 * x).sum(-1)
    >>> result = regression.fit_evaluate(x[:150], y[:150], x[150:], y[150:], kernel="additive-rbf",
    ...                                  iters=20, progress=False)
    >>> result.rmse < float(y[150:].std())
    True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpytorch
import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from . import kernels as lazy_kernels
from . import kernel_names
from .kernel_names import COMPONENT_KERNELS, DEFAULT_KERNEL, INTERACTION_KERNELS, KERNELS
from .validation import check_floating_matrix, check_positive_int, check_positive_number

__all__ = [
    "KERNELS",
    "DEFAULT_KERNEL",
    "DEFAULT_MAX_DEGREE",
    "INITIAL_NOISE",
    "TOP_ORDER_SHARE",
    "OPTIMIZERS",
    "ExactGPRegressor",
    "RegressionResult",
    "make_kernel",
    "build_model",
    "initialize",
    "train",
    "predict",
    "gaussian_metrics",
    "hyperparameters",
    "fit_evaluate",
    "plot_components",
    "PeakMemory",
]


DEFAULT_MAX_DEGREE: int | None = None
"""Highest interaction order of ``additive-ng`` and ``oak`` unless ``max_degree`` says otherwise;
``None``: every order up to the number of dimensions d (Duvenaud et al.'s model, and GPyTorch's
default), so that ``additive-ng`` contains the ARD kernel as its top order. Measured on kin40k
(1,000 points, d = 8): orders 1..4 end at a training loss of 0.84 (test RMSE 0.42), all 8 orders at
0.55. Costs D R multiply-adds per pair, against D exponentials for an ARD kernel."""

INITIAL_NOISE = 0.01
"""Noise variance at the start of training, 1% of the variance of the standardized targets. Measured on
pumadyn32nm (1,500 points, ARD RBF, L-BFGS): from GPyTorch's default 0.69, or from 0.1, training
converges to the mean predictor (outputscale 1e-5, noise 1.0); from 0.01 it finds the fit."""
#: Share of a Newton–Girard kernel's initial variance on its top order (see :func:`initialize`).
TOP_ORDER_SHARE = 0.9

OPTIMIZERS: tuple[str, ...] = kernel_names.OPTIMIZERS
"""Optimizers of :func:`train`; ``auto`` is L-BFGS on the exact (Cholesky) path, Adam on the CG path."""
_ADAM_HALVINGS = 4


def make_kernel(name: str, num_dims: int, max_degree: int | None = None) -> Kernel:
    r"""A kernel by name, with one lengthscale per input dimension.

    * ``additive-rbf`` / ``additive-matern52``: :math:`s \sum_d w_d\, k(x_d, x'_d)` with a
      one-dimensional RBF / Matérn-5/2 kernel per dimension and learned weights :math:`w_d`
      (:class:`lazykern.kernels.AdditiveStructureKernel`, one KeOps formula);
    * ``additive-ng``: interaction orders 1..R of one-dimensional RBF kernels, one variance per
      order (:class:`lazykern.kernels.NewtonGirardAdditiveKernel`, no ``ScaleKernel``);
    * ``oak``: the same over RBF kernels made orthogonal to a standard normal input measure
      (:class:`lazykern.kernels.OrthogonalAdditiveKernel`, for standardized inputs);
    * ``rbf-ard`` / ``matern52-ard``: lazykern's full-dimensional ARD kernels
      (:class:`lazykern.kernels.RBFKernel`, :class:`lazykern.kernels.MaternKernel`);
    * ``gpytorch-rbf-ard``: GPyTorch's own :class:`gpytorch.kernels.RBFKernel`, the baseline.

    Args:
        name: one of :data:`~lazykern.kernel_names.KERNELS`.
        num_dims: number of input dimensions d.
        max_degree: highest interaction order R of ``additive-ng`` and ``oak`` (default
            :data:`DEFAULT_MAX_DEGREE`: all orders); must be ``None`` for the other kernels.

    Example:
        >>> from lazykern.regression import make_kernel
        >>> type(make_kernel("additive-rbf", 26).base_kernel).__name__
        'AdditiveStructureKernel'
        >>> make_kernel("oak", 26, max_degree=2).outputscale.shape
        torch.Size([2])
        >>> make_kernel("additive-ng", 8).max_degree   # all orders by default
        8
    """
    check_positive_int("num_dims", num_dims)
    if name not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got {name!r}")
    if name in INTERACTION_KERNELS:
        if max_degree is None:
            degree = num_dims if DEFAULT_MAX_DEGREE is None else min(DEFAULT_MAX_DEGREE, num_dims)
        else:
            degree = max_degree
        if name == "oak":
            return lazy_kernels.OrthogonalAdditiveKernel(num_dims, degree)
        return lazy_kernels.NewtonGirardAdditiveKernel(lazy_kernels.RBFKernel(ard_num_dims=num_dims), num_dims, degree)
    if max_degree is not None:
        raise ValueError(f"max_degree applies to the {' and '.join(INTERACTION_KERNELS)} kernels only, not {name!r}")
    if name == "additive-rbf":
        base = lazy_kernels.AdditiveStructureKernel(
            lazy_kernels.RBFKernel(ard_num_dims=num_dims), num_dims=num_dims, component_scales=True
        )
    elif name == "additive-matern52":
        base = lazy_kernels.AdditiveStructureKernel(
            lazy_kernels.MaternKernel(nu=2.5, ard_num_dims=num_dims), num_dims=num_dims, component_scales=True
        )
    elif name == "rbf-ard":
        base = lazy_kernels.RBFKernel(ard_num_dims=num_dims)
    elif name == "matern52-ard":
        base = lazy_kernels.MaternKernel(nu=2.5, ard_num_dims=num_dims)
    else:
        base = gpytorch.kernels.RBFKernel(ard_num_dims=num_dims)
    return ScaleKernel(base)


class ExactGPRegressor(gpytorch.models.ExactGP):
    r"""Exact GP with a constant mean and a given covariance: :math:`f \sim \mathcal{GP}(c, k)`.

    Args:
        train_x: ``(n, d)`` training inputs.
        train_y: ``(n,)`` training targets.
        likelihood: a :class:`gpytorch.likelihoods.GaussianLikelihood`.
        kernel: the covariance module (e.g. from :func:`make_kernel`).

    Example:
        >>> import torch, gpytorch
        >>> from lazykern.regression import ExactGPRegressor, make_kernel
        >>> x, y = torch.randn(50, 2), torch.randn(50)
        >>> model = ExactGPRegressor(x, y, gpytorch.likelihoods.GaussianLikelihood(), make_kernel("rbf-ard", 2))
        >>> model(x).mean.shape
        torch.Size([50])
    """

    def __init__(self, train_x: Tensor, train_y: Tensor, likelihood: gpytorch.likelihoods.Likelihood,
                 kernel: Kernel) -> None:
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        """The GP prior at ``x``: constant mean, the model's kernel."""
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def build_model(
    train_x: Tensor, train_y: Tensor, kernel: str | Kernel, max_degree: int | None = None
) -> tuple[ExactGPRegressor, gpytorch.likelihoods.GaussianLikelihood]:
    """An :class:`ExactGPRegressor` and its Gaussian likelihood, in the dtype and on the device of ``train_x``.

    A kernel given by name is built by :func:`make_kernel` and initialized by :func:`initialize`;
    a kernel module is used as it is. The noise variance starts at :data:`INITIAL_NOISE`.

    Args:
        train_x: ``(n, d)`` float32/float64 training inputs.
        train_y: ``(n,)`` training targets (same dtype and device).
        kernel: a name from :data:`~lazykern.kernel_names.KERNELS` or a kernel module.
        max_degree: highest interaction order of a named ``additive-ng`` or ``oak`` kernel.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model
        >>> model, likelihood = build_model(torch.randn(50, 3), torch.randn(50), "additive-rbf")
    """
    check_floating_matrix("train_x", train_x)
    if train_x.dim() != 2:
        raise ValueError(f"train_x must have shape (n, d), got {tuple(train_x.shape)}")
    if not isinstance(train_y, Tensor) or train_y.shape != train_x.shape[:1]:
        got = tuple(train_y.shape) if isinstance(train_y, Tensor) else type(train_y).__name__
        raise ValueError(f"train_y must be a tensor of shape ({train_x.shape[0]},), got {got}")
    if isinstance(kernel, str):
        kernel = make_kernel(kernel, train_x.shape[1], max_degree)
        initialize(kernel, train_x.shape[1])
    elif max_degree is not None:
        raise ValueError("max_degree applies to kernels given by name; set it on the kernel module instead")
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = INITIAL_NOISE
    model = ExactGPRegressor(train_x, train_y.to(train_x), likelihood, kernel)
    model.to(dtype=train_x.dtype, device=train_x.device)
    return model, likelihood


def initialize(kernel: Kernel, num_dims: int) -> None:
    r"""Dimension-aware lengthscales: :math:`\sqrt w` for a kernel term over :math:`w` dimensions.

    ARD and other full-dimensional stationary kernels: :math:`w = d`; interaction kernels
    (:class:`~lazykern.kernels.NewtonGirardAdditiveKernel`, OAK): :math:`w = R`, the highest order;
    :class:`~lazykern.kernels.GroupAdditiveKernel`: the largest group; first-order additive
    kernels: :math:`w = 1`. A ``ScaleKernel`` is looked through. Inputs are assumed standardized.

    A Newton–Girard kernel also starts with :data:`TOP_ORDER_SHARE` of its variance on the top
    order and the rest spread evenly over the lower ones: with all orders (:math:`R = d`) mostly
    the ARD RBF kernel at ARD's own initialization, plus some of every lower order, so training
    starts near where ARD's does and moves variance down where the data is additive. With equal
    order variances (the kernel's default) the likelihood was flat towards the interactions on UCI
    pumadyn32nm: L-BFGS stopped after 4 evaluations at the mean predictor (test RMSE 1.02, ARD
    0.22). Measured on split 0 (float32; 1,500 points for pumadyn32nm, 1,000 for the others),
    test RMSE from equal variances / 0.9 on the top order / 0.99 on it: pumadyn32nm 1.02 / 0.218 /
    0.218 (ARD 0.224), pol 0.151 / 0.153 / 0.156 (ARD 0.160), keggdirected 0.108 / 0.111 / 0.104
    (ARD 0.101). 0.99 made the float32 demo's line search step into a matrix that was not
    positive definite; 0.9 did not.

    Args:
        kernel: the covariance module (e.g. from :func:`make_kernel`).
        num_dims: number of input dimensions d.

    Example:
        >>> from lazykern.regression import initialize, make_kernel
        >>> kernel = make_kernel("rbf-ard", 16)
        >>> initialize(kernel, 16)
        >>> kernel.base_kernel.lengthscale.mean().item()
        4.0
    """
    check_positive_int("num_dims", num_dims)
    inner = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    if isinstance(inner, lazy_kernels.NewtonGirardAdditiveKernel):
        width, base = inner.max_degree, inner.base_kernel
    elif isinstance(inner, lazy_kernels.AdditiveStructureKernel):
        width, base = 1, inner.base_kernel
    elif isinstance(inner, lazy_kernels.GroupAdditiveKernel):
        width, base = max(len(g) for g in inner.groups), inner.base_kernel
    elif getattr(inner, "has_lengthscale", False):
        width, base = num_dims, inner
    else:
        raise TypeError(f"initialize knows stationary, additive and interaction kernels, got {type(inner).__name__}")
    base.lengthscale = torch.full_like(base.lengthscale, math.sqrt(width))
    if isinstance(inner, lazy_kernels.NewtonGirardAdditiveKernel) and not isinstance(
        inner, lazy_kernels.OrthogonalAdditiveKernel
    ) and inner.max_degree > 1:
        lower = (1.0 - TOP_ORDER_SHARE) / (inner.max_degree - 1)
        variances = torch.full_like(inner.outputscale, lower)
        variances[..., -1] = TOP_ORDER_SHARE
        inner.outputscale = variances


def train(
    model: gpytorch.models.ExactGP,
    likelihood: gpytorch.likelihoods.Likelihood,
    iters: int = 200,
    lr: float | None = None,
    progress: bool = True,
    *,
    optimizer: str = "auto",
    tolerance: float = 1e-4,
) -> list[float]:
    r"""Maximize the exact marginal log likelihood until it converges; returns the loss of every step.

    The loss is :math:`-\frac1n \log p(y \mid X, \theta)`, as GPyTorch's
    :class:`~gpytorch.mlls.ExactMarginalLogLikelihood` computes it: exactly by Cholesky up to
    ``gpytorch.settings.max_cholesky_size`` training points, above by conjugate gradients and
    stochastic Lanczos quadrature on lazy matvecs.

    * ``"lbfgs"``: L-BFGS (history 10) with a strong-Wolfe line search, at most ``iters``
      iterations and ``2 iters`` loss evaluations; stops when the loss changes by less than
      ``tolerance`` between iterations. The losses returned are those of every evaluation.
    * ``"adam"``: Adam; whenever the loss improved by less than ``tolerance`` per step over the
      last :data:`~lazykern.kernel_names.ADAM_PLATEAU_WINDOW` (30) steps, the learning rate is halved;
      stops at the fifth such plateau.
    * ``"auto"``: L-BFGS when the likelihood is exact, Adam when it is stochastic (a line search
      needs a deterministic objective). Measured on a 4-dimensional toy problem (120 points,
      float64): L-BFGS converged in 35 loss evaluations to -0.617; Adam at lr 0.1 was at -0.553
      after 2,000 steps and still improving (``benchmarks/recipe.py`` measures both on UCI data).

    Args:
        model: an exact GP holding its training data.
        likelihood: its likelihood.
        iters: most steps.
        lr: initial step: default 1 for L-BFGS (the line search adapts it), 0.1 for Adam.
        progress: show a tqdm progress bar with the loss (on stderr).
        optimizer: one of :data:`OPTIMIZERS`.
        tolerance: convergence threshold on the loss (nats per training point).

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, train
        >>> model, likelihood = build_model(torch.randn(50, 2), torch.randn(50), "rbf-ard")
        >>> losses = train(model, likelihood, iters=30, progress=False)
        >>> len(losses) <= 60 and losses[-1] <= losses[0]
        True
    """
    from tqdm.auto import tqdm

    check_positive_int("iters", iters)
    if lr is not None:
        check_positive_number("lr", lr)
    check_positive_number("tolerance", tolerance)
    optimizer = _chosen_optimizer(optimizer, model.train_inputs[0].shape[-2])
    model.train()
    likelihood.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    parameters = [p for p in model.parameters() if p.requires_grad]

    def objective() -> Tensor:
        return -mll(model(*model.train_inputs), model.train_targets)

    losses: list[float] = []
    total = 2 * iters if optimizer == "lbfgs" else iters
    with tqdm(total=total, desc=f"training ({optimizer})", disable=not progress, leave=False) as bar:
        if optimizer == "lbfgs":
            opt = torch.optim.LBFGS(parameters, lr=1.0 if lr is None else lr, max_iter=iters, max_eval=2 * iters,
                                    tolerance_change=tolerance, tolerance_grad=1e-7, history_size=10,
                                    line_search_fn="strong_wolfe")

            def closure() -> Tensor:
                opt.zero_grad()
                loss = objective()
                loss.backward()
                losses.append(loss.item())
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                return loss

            opt.step(closure)
        else:
            opt = torch.optim.Adam(parameters, lr=0.1 if lr is None else lr)
            halvings, since, window = 0, 0, kernel_names.ADAM_PLATEAU_WINDOW
            for step in range(iters):
                opt.zero_grad()
                loss = objective()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                # Plateau: the loss improved by less than `tolerance` per step over the last window
                # (a window, because the stochastic CG loss is noisy from step to step).
                if step - since >= window and losses[-window - 1] - losses[-1] < tolerance * window:
                    if halvings == _ADAM_HALVINGS:
                        break
                    halvings, since = halvings + 1, step
                    for group in opt.param_groups:
                        group["lr"] /= 2
    return losses


def _chosen_optimizer(optimizer: str, n_train: int) -> str:
    """The optimizer :func:`train` runs: ``auto`` resolved by whether the likelihood is exact."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {optimizer!r}")
    if optimizer != "auto":
        return optimizer
    return "lbfgs" if n_train <= gpytorch.settings.max_cholesky_size.value() else "adam"


def predict(
    model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.Likelihood, x: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Predictive mean and variance of :math:`y_* = f(x_*) + \varepsilon` (noise included).

    Variances use LOVE (``gpytorch.settings.fast_pred_var``), which is exact up to the Lanczos rank
    and costs one cached decomposition instead of one solve per test point.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, predict
        >>> model, likelihood = build_model(torch.randn(50, 2), torch.randn(50), "rbf-ard")
        >>> mean, var = predict(model, likelihood, torch.randn(7, 2))
        >>> mean.shape, bool((var > 0).all())
        (torch.Size([7]), True)
    """
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        out = likelihood(model(x))
        return out.mean, out.variance


def gaussian_metrics(mean: Tensor, variance: Tensor, y: Tensor) -> tuple[float, float]:
    r"""Root mean squared error and mean negative log predictive density of Gaussian predictions.

    .. math::

        \text{RMSE} = \sqrt{\tfrac1m \textstyle\sum_i (y_i - \mu_i)^2}, \qquad
        \text{NLPD} = \tfrac1m \textstyle\sum_i \Big[\tfrac12 \log(2\pi v_i) + \frac{(y_i - \mu_i)^2}{2 v_i}\Big]

    Example:
        >>> import torch
        >>> from lazykern.regression import gaussian_metrics
        >>> rmse, nlpd = gaussian_metrics(torch.zeros(4), torch.ones(4), torch.ones(4))
        >>> rmse, round(nlpd, 4)
        (1.0, 1.4189)
    """
    err2 = (y - mean) ** 2
    rmse = err2.mean().sqrt().item()
    nlpd = (0.5 * torch.log(2 * math.pi * variance) + 0.5 * err2 / variance).mean().item()
    return rmse, nlpd


def hyperparameters(model: torch.nn.Module) -> dict[str, float | list[float]]:
    """The model's constrained hyperparameters by name (lengthscales, scales, noise, mean), as floats.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, hyperparameters
        >>> model, _ = build_model(torch.randn(10, 2), torch.randn(10), "rbf-ard")
        >>> sorted(hyperparameters(model))  # doctest: +NORMALIZE_WHITESPACE
        ['covar_module.base_kernel.lengthscale', 'covar_module.outputscale',
         'likelihood.noise_covar.noise', 'mean_module.constant']
    """
    out: dict[str, float | list[float]] = {}
    for name, raw, constraint in model.named_parameters_and_constraints():
        value = raw if constraint is None else constraint.transform(raw)
        prefix, _, leaf = name.rpartition(".")
        values = value.detach().cpu().reshape(-1).tolist()
        out[f"{prefix}.{leaf.removeprefix('raw_')}".lstrip(".")] = values[0] if len(values) == 1 else values
    return out


class PeakMemory:
    """Peak memory of a block of code, in MiB: CUDA allocations on a GPU, resident set size on a CPU.

    On CPU the process's high-water mark (``VmHWM``) is reset on entry through
    ``/proc/self/clear_refs`` (Linux); where that is impossible the peak since process start is
    reported and ``since_start`` is ``True``.

    Attributes:
        mb: the peak, in MiB (set on exit).
        since_start: whether ``mb`` is the peak since process start rather than since entry.

    Example:
        >>> import torch
        >>> from lazykern.regression import PeakMemory
        >>> with PeakMemory(torch.device("cpu")) as peak:
        ...     _ = torch.ones(10**6)
        >>> peak.mb > 0
        True
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.mb = float("nan")
        self.since_start = False

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                self.since_start = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            self.mb = _peak_rss_mb()


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource  # ru_maxrss: KiB on Linux, the portable fallback off Linux

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class RegressionResult:
    """What :func:`fit_evaluate` measured. ``to_dict()`` gives the JSON-ready fields.

    Attributes:
        kernel: kernel name (or class name).
        n_train, n_test, d: data sizes.
        dtype, device: where it ran.
        iters, lr, optimizer: training settings (``lr`` ``None``: the optimizer's default).
        optimizer_used: the optimizer that ran, ``"lbfgs"`` or ``"adam"`` (``"auto"`` resolved).
        max_degree: highest interaction order of the kernel (``None`` for kernels without orders).
        solver: ``"cholesky"`` or ``"cg"`` (conjugate gradients and Lanczos on lazy matvecs).
        rmse, nlpd: test RMSE and mean NLPD in the units of the targets given.
        rmse_original, nlpd_original: the same in original units (``y_scale`` applied).
        train_seconds, predict_seconds: wall-clock time of training and of prediction.
        peak_memory_mb: peak memory during training and prediction (see :class:`PeakMemory`).
        memory_measure: ``"cuda_max_allocated"`` or ``"process_peak_rss"``.
        final_loss: last training loss (negative marginal log likelihood per point).
        evaluations: number of loss evaluations during training (Adam: its steps; L-BFGS: every
            evaluation, line search included).
        hyperparameters: final hyperparameters (see :func:`hyperparameters`).
        order_shares: share of variance of each interaction order (see
            :func:`lazykern.components.component_analysis`), ``None`` for non-additive kernels.
        dimension_shares: share of variance of each input's first-order component, or ``None``.
        analysis_kind: ``"sobol"``, ``"empirical"`` or ``None``.
        model, likelihood: the trained modules (not part of ``to_dict``).
        analysis: the :class:`lazykern.components.ComponentAnalysis` (not part of ``to_dict``),
            for :func:`plot_components`.
    """

    kernel: str
    n_train: int
    n_test: int
    d: int
    dtype: str
    device: str
    iters: int
    lr: float | None
    optimizer: str
    optimizer_used: str
    max_degree: int | None
    solver: str
    rmse: float
    nlpd: float
    rmse_original: float
    nlpd_original: float
    train_seconds: float
    predict_seconds: float
    peak_memory_mb: float
    memory_measure: str
    final_loss: float
    evaluations: int
    hyperparameters: dict[str, Any]
    order_shares: list[float] | None
    dimension_shares: list[float] | None
    analysis_kind: str | None
    model: gpytorch.models.ExactGP = field(repr=False)
    likelihood: gpytorch.likelihoods.Likelihood = field(repr=False)
    analysis: Any = field(repr=False, default=None)

    def to_dict(self) -> dict[str, Any]:
        """Every measured field (everything but the modules and the analysis), JSON-serializable."""
        return {k: v for k, v in vars(self).items() if k not in ("model", "likelihood", "analysis")}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fit_evaluate(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    kernel: str | Kernel = DEFAULT_KERNEL,
    max_degree: int | None = None,
    iters: int = 200,
    lr: float | None = None,
    optimizer: str = "auto",
    tolerance: float = 1e-4,
    y_scale: float = 1.0,
    max_cholesky_size: int | None = None,
    analyze: bool = True,
    progress: bool = True,
) -> RegressionResult:
    r"""Build, train and evaluate an exact GP; the whole ``lazykern uci`` job on given tensors.

    Targets are expected standardized; ``y_scale`` (:math:`\sigma_y`) converts the metrics to
    original units: :math:`\text{RMSE} \cdot \sigma_y` and :math:`\text{NLPD} + \log \sigma_y`.

    Args:
        train_x, train_y: ``(n, d)`` and ``(n,)`` training data.
        test_x, test_y: ``(m, d)`` and ``(m,)`` test data.
        kernel: a name from :data:`~lazykern.kernel_names.KERNELS` or a kernel module.
        max_degree: highest interaction order of a named ``additive-ng`` or ``oak`` kernel.
        iters, lr, optimizer, tolerance: the training recipe (see :func:`train`).
        y_scale: standard deviation used to standardize the targets.
        max_cholesky_size: solve exactly by Cholesky up to this many training points, by
            conjugate gradients (lazy matvecs) above; ``None`` keeps
            ``gpytorch.settings.max_cholesky_size`` as it is (GPyTorch's default: 800).
        analyze: for additive and interaction kernels, run
            :func:`lazykern.components.component_analysis` after training (order and dimension
            shares in the result, the analysis for :func:`plot_components`).
        progress: show a progress bar during training.

    Example:
        >>> import torch
        >>> from lazykern.regression import fit_evaluate
        >>> x = torch.rand(120, 2, dtype=torch.float64); y = torch.sin(4 * x).sum(-1)
        >>> r = fit_evaluate(x[:100], y[:100], x[100:], y[100:], kernel="additive-rbf", iters=10,
        ...                  progress=False)
        >>> r.order_shares, len(r.dimension_shares)   # first-order additive: one order, two inputs
        ([1.0], 2)
    """
    check_floating_matrix("test_x", test_x)
    if test_x.shape[-1] != train_x.shape[-1]:
        raise ValueError(f"test_x has {test_x.shape[-1]} features but train_x has {train_x.shape[-1]}")
    if not isinstance(test_y, Tensor) or test_y.shape != test_x.shape[:1]:
        raise ValueError(f"test_y must be a tensor of shape ({test_x.shape[0]},)")
    check_positive_number("y_scale", y_scale)
    if max_cholesky_size is not None and (isinstance(max_cholesky_size, bool) or not isinstance(max_cholesky_size, int)
                                          or max_cholesky_size < 0):
        raise ValueError(f"max_cholesky_size must be a non-negative int or None, got {max_cholesky_size!r}")
    model, likelihood = build_model(train_x, train_y, kernel, max_degree)
    device = train_x.device
    if max_cholesky_size is None:
        max_cholesky_size = gpytorch.settings.max_cholesky_size.value()
    with PeakMemory(device) as peak, gpytorch.settings.max_cholesky_size(max_cholesky_size):
        optimizer_used = _chosen_optimizer(optimizer, train_x.shape[0])
        start = time.perf_counter()
        losses = train(model, likelihood, iters=iters, lr=lr, progress=progress, optimizer=optimizer,
                       tolerance=tolerance)
        _synchronize(device)
        train_seconds = time.perf_counter() - start
        start = time.perf_counter()
        mean, variance = predict(model, likelihood, test_x)
        _synchronize(device)
        predict_seconds = time.perf_counter() - start
    rmse, nlpd = gaussian_metrics(mean, variance, test_y.to(mean))
    analysis = None
    if analyze and _analyzable(model.covar_module):
        from .components import component_analysis

        with gpytorch.settings.max_cholesky_size(max_cholesky_size):
            analysis = component_analysis(model)
    inner = model.covar_module.base_kernel if isinstance(model.covar_module, ScaleKernel) else model.covar_module
    return RegressionResult(
        kernel=kernel if isinstance(kernel, str) else type(kernel).__name__,
        n_train=train_x.shape[0],
        n_test=test_x.shape[0],
        d=train_x.shape[1],
        dtype=str(train_x.dtype).removeprefix("torch."),
        device=str(device),
        iters=iters,
        lr=lr,
        optimizer=optimizer,
        optimizer_used=optimizer_used,
        max_degree=getattr(inner, "max_degree", None),
        solver="cholesky" if train_x.shape[0] <= max_cholesky_size else "cg",
        rmse=rmse,
        nlpd=nlpd,
        rmse_original=rmse * y_scale,
        nlpd_original=nlpd + math.log(y_scale),
        train_seconds=train_seconds,
        predict_seconds=predict_seconds,
        peak_memory_mb=peak.mb,
        memory_measure="cuda_max_allocated" if device.type == "cuda" else "process_peak_rss",
        final_loss=losses[-1],
        evaluations=len(losses),
        hyperparameters=hyperparameters(model),
        order_shares=None if analysis is None else analysis.order_shares.tolist(),
        dimension_shares=None if analysis is None else analysis.dimension_shares.tolist(),
        analysis_kind=None if analysis is None else analysis.kind,
        model=model,
        likelihood=likelihood,
        analysis=analysis,
    )


def _analyzable(covar: Kernel) -> bool:
    inner = covar.base_kernel if isinstance(covar, ScaleKernel) else covar
    return isinstance(inner, lazy_kernels.AdditiveStructureKernel) and not inner.batch_shape


def plot_components(
    result: RegressionResult,
    path: str | Path,
    *,
    x_mean: Tensor | None = None,
    x_std: Tensor | None = None,
    y_std: float = 1.0,
    names: list[str] | None = None,
    title: str | None = None,
) -> Path:
    """Save the component plot of a :func:`fit_evaluate` result (additive and interaction kernels).

    Args:
        result: from :func:`fit_evaluate` with ``analyze=True``.
        path: image file to write (format from the suffix).
        x_mean, x_std, y_std: draw in original units (e.g. from a :class:`lazykern.data.UCISplit`).
        names: one name per input dimension.
        title: figure title.

    Example:
        >>> plot_components(result, "pol.png", x_mean=data.x_mean, x_std=data.x_std,
        ...                 y_std=data.y_std, title="pol")  # doctest: +SKIP
    """
    from .components import plot_components as plot

    if result.analysis is None:
        raise ValueError(f"no component analysis for kernel {result.kernel!r}: plot_components needs an additive "
                         f"or interaction kernel ({', '.join(COMPONENT_KERNELS)}) and analyze=True")
    return plot(result.analysis, path, names=names, x_mean=x_mean, x_std=x_std, y_std=y_std, title=title)
