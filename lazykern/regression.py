r"""Exact GP regression with lazy kernels: build, train, predict, score.

The one implementation behind ``lazykern uci``, ``lazykern demo``, the examples and the UCI
benchmark. The model is GPyTorch's standard exact GP,

.. math::

    y = f(x) + \varepsilon, \quad f \sim \mathcal{GP}(c, s\,k), \quad \varepsilon \sim \mathcal N(0, \sigma^2),

with a constant mean :math:`c`, an output scale :math:`s` (``ScaleKernel``), a Gaussian likelihood, and
all hyperparameters trained by Adam on the exact marginal log likelihood.

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
from typing import Any

import gpytorch
import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from . import kernels as lazy_kernels
from .kernel_names import KERNELS
from .validation import check_floating_matrix, check_positive_int, check_positive_number

__all__ = [
    "KERNELS",
    "ExactGPRegressor",
    "RegressionResult",
    "make_kernel",
    "build_model",
    "train",
    "predict",
    "gaussian_metrics",
    "hyperparameters",
    "fit_evaluate",
    "PeakMemory",
]


def make_kernel(name: str, num_dims: int) -> ScaleKernel:
    r"""A scaled kernel by name, with one lengthscale per input dimension.

    * ``additive-rbf`` / ``additive-matern52``: :math:`s \sum_d w_d\, k(x_d, x'_d)` with a
      one-dimensional RBF / Matérn-5/2 kernel per dimension and learned weights :math:`w_d`
      (:class:`lazykern.kernels.AdditiveStructureKernel`, one KeOps formula);
    * ``rbf-ard`` / ``matern52-ard``: lazykern's full-dimensional ARD kernels
      (:class:`lazykern.kernels.RBFKernel`, :class:`lazykern.kernels.MaternKernel`);
    * ``gpytorch-rbf-ard``: GPyTorch's own :class:`gpytorch.kernels.RBFKernel`, the baseline.

    Args:
        name: one of :data:`KERNELS`.
        num_dims: number of input dimensions d.

    Example:
        >>> from lazykern.regression import make_kernel
        >>> type(make_kernel("additive-rbf", 26).base_kernel).__name__
        'AdditiveStructureKernel'
    """
    check_positive_int("num_dims", num_dims)
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
    elif name == "gpytorch-rbf-ard":
        base = gpytorch.kernels.RBFKernel(ard_num_dims=num_dims)
    else:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got {name!r}")
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
    train_x: Tensor, train_y: Tensor, kernel: str | Kernel
) -> tuple[ExactGPRegressor, gpytorch.likelihoods.GaussianLikelihood]:
    """An :class:`ExactGPRegressor` and its Gaussian likelihood, in the dtype and on the device of ``train_x``.

    Args:
        train_x: ``(n, d)`` float32/float64 training inputs.
        train_y: ``(n,)`` training targets (same dtype and device).
        kernel: a name from :data:`KERNELS` or a kernel module.

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
        kernel = make_kernel(kernel, train_x.shape[1])
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPRegressor(train_x, train_y.to(train_x), likelihood, kernel)
    model.to(dtype=train_x.dtype, device=train_x.device)
    return model, likelihood


def train(
    model: gpytorch.models.ExactGP,
    likelihood: gpytorch.likelihoods.Likelihood,
    iters: int = 50,
    lr: float = 0.1,
    progress: bool = True,
) -> list[float]:
    r"""Maximize the exact marginal log likelihood with Adam; returns the loss of every iteration.

    The loss is :math:`-\frac1n \log p(y \mid X, \theta)`, as GPyTorch's
    :class:`~gpytorch.mlls.ExactMarginalLogLikelihood` computes it (by conjugate gradients and
    stochastic Lanczos quadrature above ``gpytorch.settings.max_cholesky_size`` training points).

    Args:
        model: an exact GP holding its training data.
        likelihood: its likelihood.
        iters: number of Adam steps.
        lr: Adam learning rate.
        progress: show a tqdm progress bar with the loss (on stderr).

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, train
        >>> model, likelihood = build_model(torch.randn(50, 2), torch.randn(50), "rbf-ard")
        >>> len(train(model, likelihood, iters=3, progress=False))
        3
    """
    from tqdm.auto import tqdm

    check_positive_int("iters", iters)
    check_positive_number("lr", lr)
    model.train()
    likelihood.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    losses = []
    with tqdm(range(iters), desc="training", disable=not progress, leave=False) as bar:
        for _ in bar:
            optimizer.zero_grad()
            loss = -mll(model(*model.train_inputs), model.train_targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    return losses


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
        iters, lr: training settings.
        solver: ``"cholesky"`` or ``"cg"`` (conjugate gradients and Lanczos on lazy matvecs).
        rmse, nlpd: test RMSE and mean NLPD in the units of the targets given.
        rmse_original, nlpd_original: the same in original units (``y_scale`` applied).
        train_seconds, predict_seconds: wall-clock time of training and of prediction.
        peak_memory_mb: peak memory during training and prediction (see :class:`PeakMemory`).
        memory_measure: ``"cuda_max_allocated"`` or ``"process_peak_rss"``.
        final_loss: last training loss (negative marginal log likelihood per point).
        hyperparameters: final hyperparameters (see :func:`hyperparameters`).
        model, likelihood: the trained modules (not part of ``to_dict``).
    """

    kernel: str
    n_train: int
    n_test: int
    d: int
    dtype: str
    device: str
    iters: int
    lr: float
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
    hyperparameters: dict[str, Any]
    model: gpytorch.models.ExactGP = field(repr=False)
    likelihood: gpytorch.likelihoods.Likelihood = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Every measured field (everything but the modules), JSON-serializable."""
        return {k: v for k, v in vars(self).items() if k not in ("model", "likelihood")}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fit_evaluate(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    kernel: str | Kernel = "additive-rbf",
    iters: int = 50,
    lr: float = 0.1,
    y_scale: float = 1.0,
    max_cholesky_size: int | None = None,
    progress: bool = True,
) -> RegressionResult:
    r"""Build, train and evaluate an exact GP; the whole ``lazykern uci`` job on given tensors.

    Targets are expected standardized; ``y_scale`` (:math:`\sigma_y`) converts the metrics to
    original units: :math:`\text{RMSE} \cdot \sigma_y` and :math:`\text{NLPD} + \log \sigma_y`.

    Args:
        train_x, train_y: ``(n, d)`` and ``(n,)`` training data.
        test_x, test_y: ``(m, d)`` and ``(m,)`` test data.
        kernel: a name from :data:`KERNELS` or a kernel module.
        iters, lr: Adam steps and learning rate.
        y_scale: standard deviation used to standardize the targets.
        max_cholesky_size: solve exactly by Cholesky up to this many training points, by
            conjugate gradients (lazy matvecs) above; ``None`` keeps
            ``gpytorch.settings.max_cholesky_size`` as it is (GPyTorch's default: 800).
        progress: show a progress bar during training.

    Example:
        >>> import torch
        >>> from lazykern.regression import fit_evaluate
        >>> x = torch.rand(120, 2, dtype=torch.float64); y = torch.sin(4 * x).sum(-1)
        >>> r = fit_evaluate(x[:100], y[:100], x[100:], y[100:], kernel="additive-rbf", iters=10,
        ...                  progress=False)
        >>> sorted(r.to_dict())[:3]
        ['d', 'device', 'dtype']
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
    model, likelihood = build_model(train_x, train_y, kernel)
    device = train_x.device
    if max_cholesky_size is None:
        max_cholesky_size = gpytorch.settings.max_cholesky_size.value()
    with PeakMemory(device) as peak, gpytorch.settings.max_cholesky_size(max_cholesky_size):
        start = time.perf_counter()
        losses = train(model, likelihood, iters=iters, lr=lr, progress=progress)
        _synchronize(device)
        train_seconds = time.perf_counter() - start
        start = time.perf_counter()
        mean, variance = predict(model, likelihood, test_x)
        _synchronize(device)
        predict_seconds = time.perf_counter() - start
    rmse, nlpd = gaussian_metrics(mean, variance, test_y.to(mean))
    return RegressionResult(
        kernel=kernel if isinstance(kernel, str) else type(kernel).__name__,
        n_train=train_x.shape[0],
        n_test=test_x.shape[0],
        d=train_x.shape[1],
        dtype=str(train_x.dtype).removeprefix("torch."),
        device=str(device),
        iters=iters,
        lr=lr,
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
        hyperparameters=hyperparameters(model),
        model=model,
        likelihood=likelihood,
    )
