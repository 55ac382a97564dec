r"""The recipe: every choice of the training job that is not the data or the kernel, in one frozen value.

:class:`Recipe` holds the optimizer and its budget, the warm start, the size up to which solves are
exact, and the noise floor (:class:`NoiseFloor`). The steps of :mod:`lazykern.regression.steps` read
it, ``lazykern uci`` and ``lazykern demo`` build one from their flags, and
:func:`~lazykern.regression.fit_evaluate` folds its older keywords into one
(:meth:`Recipe.of`), so that a new option of the job is a field here and a flag of the command.

Example:
    >>> from dataclasses import replace
    >>> from lazykern.regression import NoiseFloor, Recipe
    >>> recipe = Recipe(iters=50, warm_start_size=200, max_cholesky_size=1000)
    >>> recipe.warm_start_budget, replace(recipe, warm_start_iters=20).warm_start_budget
    (50, 20)
    >>> replace(recipe, noise_floor=NoiseFloor(0.01)).noise_floor
    NoiseFloor(policy=0.01, size=1000)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import gpytorch
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..kernel_names import LEARNED_PROJECTION_KERNELS
from ..kernels.base import LazyKernel
from ..validation import check_choice, check_non_negative_int, check_positive_int, check_positive_int_at_most, \
    check_positive_number
from .selection import ARD_FIT_POINTS, ard_noise_floor
from .training import check_optimizer

__all__ = ["LARGE_N", "NoiseFloor", "Recipe", "learns_projections"]


@dataclass(frozen=True)
class NoiseFloor:
    r"""How low the noise variance may go: a lower bound :math:`\sigma^2 \ge \sigma^2_{\min}` of the
    Gaussian likelihood's noise, or none.

    A kernel with many free parameters (learned projection directions: :math:`dJ` of them) can raise
    the marginal likelihood by explaining the noise as function, and then predicts overconfidently;
    bounding its noise by what a simpler model finds on the same data prevents that
    (``docs/projected.rst``, "Bounding the noise").

    Args:
        policy: ``None``: no floor (GPyTorch's bound of 1e-4; ``--noise-floor none``); a positive
            number: that floor, in the units of the targets squared; ``"ard"``: the noise ARD RBF
            fits exactly on ``size`` of the training points
            (:func:`~lazykern.regression.ard_noise_floor`); ``"auto"`` (the default): ``"ard"`` for a
            kernel that learns projection directions (a name in
            :data:`~lazykern.kernel_names.LEARNED_PROJECTION_KERNELS`, or a module holding a
            :class:`~lazykern.kernels.ProjectedAdditiveKernel` with ``learn_projections=True``),
            ``None`` for the others.
        size: training points of the ARD fit (``"ard"`` and ``"auto"``).

    Example:
        >>> import torch
        >>> from lazykern.regression import NoiseFloor
        >>> x = torch.rand(60, 2, dtype=torch.float64); y = torch.sin(4 * x[:, 0])
        >>> NoiseFloor(0.05).resolve("rbf-ard", x, y), NoiseFloor("auto").resolve("rbf-ard", x, y)
        (0.05, None)
        >>> NoiseFloor("ard", size=40).resolve("rbf-ard", x, y, iters=20, progress=False) > 0
        True
    """

    policy: float | str | None = "auto"
    size: int = ARD_FIT_POINTS

    def __post_init__(self) -> None:
        if isinstance(self.policy, str):
            check_choice("noise_floor", self.policy, ("ard", "auto"))
        elif self.policy is not None:
            check_positive_number("noise_floor", self.policy)
        check_positive_int("size", self.size)

    def resolve(self, kernel: str | Kernel, train_x: Tensor, train_y: Tensor, *, iters: int = 200,
                progress: bool = True, ard_noise: float | None = None) -> float | None:
        """The floor for ``kernel`` on this data: the value given, the noise of ARD RBF's exact fit
        (at most ``iters`` L-BFGS iterations, with a progress bar if ``progress``), or ``None``.

        Args:
            kernel: a name from :data:`~lazykern.kernel_names.KERNELS` or a kernel module.
            train_x, train_y: ``(n, d)`` and ``(n,)`` training data.
            iters: most L-BFGS iterations of the ARD fit.
            progress: show the ARD fit's progress bar.
            ard_noise: the noise of an ARD fit already made on this data (the recipe's ``ard_start``),
                taken instead of fitting again.
        """
        if self.policy == "ard" or (self.policy == "auto" and learns_projections(kernel)):
            if ard_noise is not None:
                return ard_noise
            return ard_noise_floor(train_x, train_y, size=self.size, iters=iters, progress=progress)
        return None if isinstance(self.policy, str) else self.policy


def learns_projections(kernel: str | Kernel) -> bool:
    """Whether ``kernel`` (a name or a module) trains the directions of a projected kernel."""
    if isinstance(kernel, str):
        return kernel in LEARNED_PROJECTION_KERNELS
    return isinstance(kernel, torch.nn.Module) and any(
        isinstance(m, LazyKernel) and m.learns_projections for m in kernel.modules())


@dataclass(frozen=True)
class Recipe:
    r"""How an exact GP is trained and evaluated: the optimizer of
    :math:`-\frac1n \log p(y \mid X, \theta)` and its budget, where training starts, which solves
    are exact and how low the noise may go.

    One frozen value, so that a run is described by (data, kernel, recipe) and a variant is
    ``dataclasses.replace(recipe, ...)``; every option is checked here, before any work.

    Args:
        optimizer: ``"auto"``, ``"lbfgs"`` or ``"adam"`` (:data:`~lazykern.kernel_names.OPTIMIZERS`;
            see :func:`~lazykern.regression.train`).
        iters: most optimizer iterations.
        lr: initial step (``None``: the optimizer's default).
        tolerance: convergence threshold in nats per training point (``None``: the optimizer's,
            :data:`~lazykern.kernel_names.TOLERANCES`).
        warm_start_size: first fit the hyperparameters exactly on a random subset of this many
            training points (:func:`~lazykern.regression.warm_start`), then train on all of them; at
            most ``max_cholesky_size`` (the subset's fit is exact), and no warm start where it is not
            below the number of training points. ``None``: train from the recipe's initialization.
        warm_start_iters: most L-BFGS iterations of the subset's fit (``None``: ``iters``).
        max_cholesky_size: solve exactly by Cholesky up to this many training points, by conjugate
            gradients on lazy matvecs above; ``None``: ``gpytorch.settings.max_cholesky_size`` as it
            is when the job is prepared (GPyTorch's default: 800).
        noise_floor: the lower bound of the noise variance (:class:`NoiseFloor`).
        ard_start: for a kernel that learns projection directions, start them as its diverse
            directions divided by the lengthscales ARD RBF fits exactly on this many training points
            (:func:`~lazykern.regression.ard_scaled_directions`: each projection then starts at ARD's
            input scales); that fit's noise also serves a ``"ard"`` or ``"auto"`` noise floor.
            ``None``: the directions start as the kernel made them.
        cg_tolerance: the relative residual of training's conjugate-gradient solves above
            ``max_cholesky_size`` (``None``: ``linear_operator``'s ``cg_tolerance``, 1).
        solve_tolerance: the relative residual of the predictive mean's conjugate-gradient solve
            (``None``: GPyTorch's ``eval_cg_tolerance``, 0.01).

    Example:
        >>> from lazykern.regression import NoiseFloor, Recipe
        >>> Recipe(optimizer="adam", iters=100, noise_floor=NoiseFloor(None)).noise_floor.policy is None
        True
        >>> Recipe(warm_start_size=300, max_cholesky_size=200)
        Traceback (most recent call last):
        ValueError: warm_start_size must be at most max_cholesky_size (200), got 300
    """

    optimizer: str = "auto"
    iters: int = 200
    lr: float | None = None
    tolerance: float | None = None
    warm_start_size: int | None = None
    warm_start_iters: int | None = None
    max_cholesky_size: int | None = None
    noise_floor: NoiseFloor = field(default_factory=NoiseFloor)
    ard_start: int | None = None
    cg_tolerance: float | None = None
    solve_tolerance: float | None = None

    def __post_init__(self) -> None:
        check_optimizer(self.optimizer)
        check_positive_int("iters", self.iters)
        for name in ("lr", "tolerance", "cg_tolerance", "solve_tolerance"):
            if getattr(self, name) is not None:
                check_positive_number(name, getattr(self, name))
        check_positive_int("ard_start", self.ard_start, optional=True)
        check_positive_int("warm_start_size", self.warm_start_size, optional=True)
        check_positive_int("warm_start_iters", self.warm_start_iters, optional=True)
        check_non_negative_int("max_cholesky_size", self.max_cholesky_size, optional=True)
        if self.warm_start_size is not None and self.max_cholesky_size is not None:
            check_positive_int_at_most("warm_start_size", self.warm_start_size, self.max_cholesky_size,
                                       f"max_cholesky_size ({self.max_cholesky_size})")
        if not isinstance(self.noise_floor, NoiseFloor):
            raise TypeError(f"noise_floor must be a NoiseFloor, got {type(self.noise_floor).__name__} "
                            f"(NoiseFloor({self.noise_floor!r}) takes a value, 'ard', 'auto' or None)")

    @property
    def warm_start_budget(self) -> int:
        """The most L-BFGS iterations of the warm start's exact fit, ``warm_start_iters`` or else ``iters``."""
        return self.iters if self.warm_start_iters is None else self.warm_start_iters

    def warms_start(self, n_train: int) -> bool:
        """Whether training on ``n_train`` points starts from a subset's exact fit."""
        return self.warm_start_size is not None and self.warm_start_size < n_train

    def resolved(self) -> Recipe:
        """This recipe with ``max_cholesky_size`` read from ``gpytorch.settings`` where it is ``None``
        (and ``warm_start_size`` checked against it): the recipe as it runs from now on."""
        if self.max_cholesky_size is not None:
            return self
        return replace(self, max_cholesky_size=gpytorch.settings.max_cholesky_size.value())

    @classmethod
    def of(cls, recipe: Recipe | None = None, **options: Any) -> Recipe:
        """``recipe``, or the recipe that ``options`` (fields of :class:`Recipe` by name) describe:
        the one place where :func:`~lazykern.regression.fit_evaluate`'s keywords become a recipe.

        ``noise_floor`` may be given as a :class:`NoiseFloor` or as its policy. Beside a ``recipe``,
        every option must keep its default: the recipe says it.

        Example:
            >>> from lazykern.regression import Recipe
            >>> Recipe.of(iters=30, noise_floor=None).noise_floor.policy is None
            True
            >>> Recipe.of(Recipe(iters=30), iters=50)
            Traceback (most recent call last):
            ValueError: give iters in the recipe, not beside it
        """
        if "noise_floor" in options and not isinstance(options["noise_floor"], NoiseFloor):
            options["noise_floor"] = NoiseFloor(options["noise_floor"])
        if recipe is None:
            return cls(**options)
        defaults = cls()
        beside = [name for name, value in options.items() if value != getattr(defaults, name)]
        if beside:
            raise ValueError(f"give {', '.join(beside)} in the recipe, not beside it")
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a Recipe, got {type(recipe).__name__}")
        return recipe


LARGE_N = Recipe(optimizer="adam", iters=150, lr=0.01, warm_start_size=2000, warm_start_iters=150,
                 max_cholesky_size=2000, noise_floor=NoiseFloor("auto"), ard_start=2000, cg_tolerance=0.01,
                 solve_tolerance=1e-8)
"""The recipe for every training point on a CPU (``docs/large_n.rst`` has the measurements that chose it):

1. ARD RBF fitted exactly on 2,000 of the points: its lengthscales scale the starting directions of a
   kernel that learns them, its noise bounds the noise below (``ard_start``, ``noise_floor``);
2. the hyperparameters fitted exactly (Cholesky, L-BFGS) on 2,000 of the points (the warm start);
3. Adam on all points, conjugate gradients to a relative residual of 0.01 with the structured
   engine's grid preconditioner, built for every step, and Lanczos quadrature from the same solves
   (:class:`~lazykern.regression.ExactMLL`), in float64;
4. the predictive mean's weights solved in float64 to a relative residual of 1e-8.

The kernel it is made for is a sum of one-dimensional terms the structured engine takes (the
command's default on a CPU: learned projections, :data:`~lazykern.kernel_names.LARGE_N_KERNEL`), whose
products cost :math:`O(N J)`; its variances come from the grid's own model, checked against the exact
bounds (:func:`~lazykern.regression.evaluate`).

Example:
    >>> from lazykern.regression import LARGE_N
    >>> LARGE_N.optimizer, LARGE_N.warm_start_size, LARGE_N.solve_tolerance
    ('adam', 2000, 1e-08)
"""
