r"""Exact GP regression with lazy kernels: the training job of ``lazykern uci``, ``lazykern demo``, the
examples and the UCI benchmark; every name below is imported from ``lazykern.regression``.

One module per job: the model (``model.py``), the optimizer loop (``training.py``), the exact fits on
a subset that choose where training starts and how low the noise goes (``selection.py``), the
likelihood's gradient (``likelihood.py``), predictions and their checks (``prediction.py``), the
:class:`Recipe` (``recipe.py``), the job's steps and their records (``steps.py``), and the whole job
(``job.py``: :func:`fit_evaluate`).

The model is GPyTorch's standard exact GP,

.. math::

    y = f(x) + \varepsilon, \quad f \sim \mathcal{GP}(c, s\,k), \quad \varepsilon \sim \mathcal N(0, \sigma^2),

with a constant mean :math:`c`, an output scale :math:`s` (``ScaleKernel``; the interaction kernels
carry one variance per order instead), a Gaussian likelihood, and all hyperparameters trained on
the exact marginal log likelihood by one recipe for every kernel (:class:`Recipe`, :func:`train`):

* **dimension-aware initialization** (:func:`initialize`): a kernel term that multiplies
  :math:`w` standardized dimensions starts at lengthscale :math:`\sqrt w` (the ARD kernels
  :math:`\sqrt d`, an interaction kernel :math:`\sqrt R`, a first-order additive kernel 1). A
  squared distance between standardized points is about :math:`2 w`, so every term starts near
  :math:`e^{-1}`, where GPyTorch's fixed default lengthscale makes a kernel in many dimensions
  start near 0 between any two points, and the likelihood has no slope but towards "all noise".
  BoTorch's dimension-scaled lengthscale prior (Hvarfner et al., 2024) rests on the same
  observation. The noise variance starts low (:data:`INITIAL_NOISE`), so that the first steps fit
  the data instead of declaring it noise;
* **binary and categorical inputs** (columns of at most :data:`DISCRETE_MAX_LEVELS` values,
  :func:`discrete_columns`) have their lengthscales bounded below by :data:`DISCRETE_FLOOR` of
  the smallest gap between their values (:func:`floor_discrete_lengthscales`): below it the
  likelihood is flat, and the optimizer may drift to lengthscales near 0;
* **an optimizer that stops when converged**: L-BFGS with a strong-Wolfe line search while the
  likelihood is exact (Cholesky, up to ``max_cholesky_size`` points; its gradient from one inverse
  of the factor, :class:`ExactMLL`), Adam with a plateau schedule on the stochastic
  conjugate-gradient path, both stopping when the loss stops improving (``tolerance``,
  :data:`~lazykern.kernel_names.TOLERANCES`) or after ``iters`` steps, and saying which
  (:class:`TrainingLog`); a float32 model whose L-BFGS converged is refined in float64 until it
  converges again (float32 rounding ends line searches early), and a float32 model on CPU tensors
  trains in float64 on the conjugate-gradient path (:func:`trains_in_float64`: preconditioned CG
  stalls in float32);
* **an exact warm start on request** (:func:`warm_start`, ``Recipe(warm_start_size=M)``,
  ``lazykern uci --warm-start M``): L-BFGS first fits the hyperparameters exactly on a random
  subset of M points (at most ``warm_start_iters`` iterations) and training goes on from there on
  all of them; it helps where Adam from the recipe's start ends in a poor optimum, and saves
  full-size exact steps where each costs much (``docs/projected.rst``);
* **a noise floor where the kernel can explain the noise** (:class:`NoiseFloor`): a lower bound of
  the noise variance, by default the noise ARD RBF fits on a subset (:func:`ard_noise_floor`) for
  kernels that train their projection directions;
* **a recipe that steps in instead of failing**: an evaluation whose Cholesky factorization fails
  goes back to the best hyperparameters evaluated so far and continues in float64, a float32
  prediction that fails or whose conjugate gradients stall is made again in float64, and each
  such step is said (``interventions``); the UCI pages of the docs hold the runs behind each rule.

Example:
    >>> import torch
    >>> from lazykern import regression
    >>> x = torch.rand(200, 3, dtype=torch.float64)
    >>> y = torch.sin(6 * x).sum(-1)
    >>> result = regression.fit_evaluate(x[:150], y[:150], x[150:], y[150:], kernel="additive-rbf",
    ...                                  recipe=regression.Recipe(iters=20), progress=False)
    >>> result.rmse < float(y[150:].std())
    True
"""


from ..kernel_names import DEFAULT_KERNEL, KERNELS
from ..timing import PeakMemory
from .job import RegressionResult, fit_evaluate
from .likelihood import ExactMLL
from .model import DEFAULT_MAX_DEGREE, DISCRETE_FLOOR, DISCRETE_MAX_LEVELS, INITIAL_NOISE, TOP_ORDER_SHARE, \
    ExactGPRegressor, build_model, discrete_columns, floor_discrete_lengthscales, hyperparameters, initialize, \
    make_kernel
from .prediction import gaussian_metrics, predict, variance_bounds
from .recipe import LARGE_N, NoiseFloor, Recipe
from .selection import ard_noise_floor, ard_scaled_directions, warm_start
from .steps import Analyzed, Evaluated, Fitted, Prepared, analyze, evaluate, fit, prepare
from .training import ADAM_PLATEAU_WINDOW, OPTIMIZERS, TOLERANCES, TrainingLog, refines_in_float64, \
    resolve_optimizer, to_float64, train, trains_in_float64

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
    "Recipe",
    "LARGE_N",
    "NoiseFloor",
    "Prepared",
    "Fitted",
    "Evaluated",
    "Analyzed",
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
    "prepare",
    "fit",
    "evaluate",
    "analyze",
    "fit_evaluate",
    "PeakMemory",
]
