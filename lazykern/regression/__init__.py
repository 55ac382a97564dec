r"""Exact GP regression with lazy kernels: build a model (``regression/model.py``), train it
(``regression/training.py``), evaluate it (``regression/evaluation.py``); every name below is
imported from ``lazykern.regression``.

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
* **binary and categorical inputs** (columns of at most :data:`DISCRETE_MAX_LEVELS` values,
  :func:`discrete_columns`) have their lengthscales bounded below by :data:`DISCRETE_FLOOR` of
  the smallest gap between their values (:func:`floor_discrete_lengthscales`): below it the
  likelihood is flat, and OAK's lengthscales on UCI bike's binary inputs drifted towards 0;
* **an optimizer that stops when converged**: L-BFGS with a strong-Wolfe line search while the
  likelihood is exact (Cholesky, up to ``gpytorch.settings.max_cholesky_size`` points; its gradient
  from one inverse of the factor, :class:`ExactMLL`), Adam with
  a plateau schedule on the stochastic conjugate-gradient path, both stopping when the loss stops
  improving (``tolerance``, :data:`~lazykern.kernel_names.TOLERANCES`) or after ``iters`` steps, and saying which
  (:class:`TrainingLog`); a float32 model whose L-BFGS converged is refined in float64 until it
  converges again (float32 rounding ends line searches early), and a float32 model on CPU tensors
  trains in float64 on the conjugate-gradient path (:func:`trains_in_float64`: preconditioned CG
  stalls in float32);
* **an exact warm start on request** (:func:`warm_start`, ``fit_evaluate(warm_start_size=M)``,
  ``lazykern uci --warm-start M``): L-BFGS first fits the hyperparameters exactly on a random
  subset of M points and training goes on from there on all of them (Adam above
  ``max_cholesky_size`` points, L-BFGS below); it helps where Adam from the recipe's start ends in a
  poor optimum (the projected kernels on UCI kin40k and protein, ``docs/projected.rst``), and saves
  full-size exact steps where each costs much (hundreds of projections);
* **a noise floor where the kernel can explain the noise** (``build_model``/``fit_evaluate(noise_floor=...)``):
  a lower bound of the noise variance (learned projections on UCI pol drove it to GPyTorch's bound of
  1e-4); ``noise_floor="ard"`` takes the noise ARD RBF fits on a subset (:func:`ard_noise_floor`), which
  :func:`ard_scaled_directions` also returns, and ``fit_evaluate`` does so by default for kernels that train
  their projection directions;
* **a recipe that steps in instead of failing**: an evaluation whose Cholesky factorization fails
  goes back to the best hyperparameters evaluated so far and continues in float64 (the cause on
  UCI data was float32 rounding), and says so (``interventions``).

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


from ..kernel_names import DEFAULT_KERNEL, KERNELS
from .evaluation import (
    PeakMemory, RegressionResult, fit_evaluate, gaussian_metrics, hyperparameters, predict, variance_bounds,
)
from .likelihood import ExactMLL
from .model import DEFAULT_MAX_DEGREE, DISCRETE_FLOOR, DISCRETE_MAX_LEVELS, INITIAL_NOISE, TOP_ORDER_SHARE, \
    ExactGPRegressor, build_model, discrete_columns, floor_discrete_lengthscales, initialize, make_kernel
from .training import ADAM_PLATEAU_WINDOW, OPTIMIZERS, TOLERANCES, TrainingLog, ard_noise_floor, \
    ard_scaled_directions, refines_in_float64, resolve_optimizer, to_float64, train, trains_in_float64, warm_start

__all__ = [
    "KERNELS",
    "DEFAULT_KERNEL",
    "DEFAULT_MAX_DEGREE",
    "INITIAL_NOISE",
    "TOP_ORDER_SHARE",
    "DISCRETE_MAX_LEVELS",
    "DISCRETE_FLOOR",
    "OPTIMIZERS",
    "TOLERANCES",
    "ADAM_PLATEAU_WINDOW",
    "ExactGPRegressor",
    "RegressionResult",
    "TrainingLog",
    "ExactMLL",
    "make_kernel",
    "build_model",
    "initialize",
    "discrete_columns",
    "floor_discrete_lengthscales",
    "train",
    "warm_start",
    "ard_scaled_directions",
    "ard_noise_floor",
    "resolve_optimizer",
    "refines_in_float64",
    "trains_in_float64",
    "to_float64",
    "predict",
    "variance_bounds",
    "gaussian_metrics",
    "hyperparameters",
    "fit_evaluate",
    "PeakMemory",
]
