"""Names of the kernels and optimizers the regression job uses (:func:`lazykern.regression.make_kernel`,
:func:`lazykern.regression.train`, ``lazykern uci --kernel/--optimizer``).

A module of plain names, free of torch and GPyTorch, so that the ``lazykern`` command lists and
checks them before importing anything heavy (``lazykern --help`` answers at once).
"""

from __future__ import annotations

__all__ = [
    "KERNELS", "DEFAULT_KERNEL", "COMPARE_KERNELS", "INTERACTION_KERNELS", "PROJECTED_KERNELS",
    "LEARNED_PROJECTION_KERNELS", "COMPONENT_KERNELS", "GPYTORCH_KERNELS", "OPTIMIZERS", "TOLERANCES",
    "PROJECTIONS_PER_DIMENSION", "default_num_projections", "FULL_SET_KERNELS", "LARGE_N_KERNEL",
    "LARGE_N_MAX_PROJECTIONS", "large_n_num_projections",
]

KERNELS: tuple[str, ...] = (
    "additive-rbf",
    "additive-matern52",
    "additive-ng",
    "oak",
    "dpa-matern52",
    "dpa-rbf",
    "dpa-matern52-learned",
    "rpa-matern52",
    "rpa-rbf",
    "rbf-ard",
    "matern52-ard",
    "gpytorch-rbf-ard",
)
"""Kernel names accepted by :func:`lazykern.regression.make_kernel` (and ``lazykern uci --kernel``)."""

DEFAULT_KERNEL = "additive-ng"
"""The kernel :func:`lazykern.regression.fit_evaluate` and ``lazykern uci`` use unless told otherwise
(the docs' "UCI results" page says why)."""

COMPARE_KERNELS: tuple[str, ...] = ("rbf-ard", "gpytorch-rbf-ard")
"""The references ``lazykern uci --compare`` trains on the same split: lazykern's full ARD RBF kernel
and GPyTorch's own :class:`gpytorch.kernels.RBFKernel`."""

INTERACTION_KERNELS: tuple[str, ...] = ("additive-ng", "oak")
"""The kernels with interaction orders 1..R, the ones that take a ``max_degree`` (``--max-degree``)."""

PROJECTED_KERNELS: tuple[str, ...] = ("dpa-matern52", "dpa-rbf", "dpa-matern52-learned", "rpa-matern52", "rpa-rbf")
"""Sums of one-dimensional kernels on J projections of the inputs (:class:`lazykern.kernels.ProjectedAdditiveKernel`),
diverse (``dpa-``) or random (``rpa-``) directions, fixed or (``-learned``) trained; the ones that take a
``num_projections`` (``--projections``)."""

LEARNED_PROJECTION_KERNELS: tuple[str, ...] = ("dpa-matern52-learned",)
"""The projected kernels whose directions are trained. Their :math:`dJ` direction parameters can explain
the noise, so the recipe bounds the noise variance below by the one ARD RBF fits on the same data
(:class:`lazykern.regression.NoiseFloor` ``("auto")``, ``lazykern uci``'s default ``--noise-floor``),
which keeps their predictions from becoming overconfident (``docs/projected.rst``, "Fixed or learned
directions", has the runs)."""

COMPONENT_KERNELS: tuple[str, ...] = ("additive-rbf", "additive-matern52", *INTERACTION_KERNELS)
"""The kernels made of additive components, for which a trained model's order and dimension shares
and its component plot (:func:`lazykern.components.plot_components`, ``--plot``) exist."""

GPYTORCH_KERNELS: tuple[str, ...] = ("gpytorch-rbf-ard",)
"""GPyTorch's own kernels among :data:`KERNELS`, for which nothing of lazykern's is compiled
(``lazykern precompile`` skips them)."""

OPTIMIZERS: tuple[str, ...] = ("auto", "lbfgs", "adam")
"""Optimizers of :func:`lazykern.regression.train`; ``auto`` is L-BFGS on the exact (Cholesky) path,
Adam on the CG path."""

TOLERANCES: dict[str, float] = {"lbfgs": 1e-6, "adam": 1e-4}
"""Convergence threshold of each optimizer unless ``tolerance`` (``--tolerance``) says otherwise, in
nats per training point: L-BFGS stops when the loss changes by less than this between iterations,
Adam's plateau rule compares its per-step improvement over :data:`~lazykern.regression.ADAM_PLATEAU_WINDOW`
steps with it.

L-BFGS's is small because a looser threshold stops where the loss is still falling
(``docs/uci.rst``, "Training to convergence"); Adam's stochastic conjugate-gradient loss is noisy
from step to step, and its plateau rule keeps a looser one."""


PROJECTIONS_PER_DIMENSION = 2
"""The projected kernels' number of projections per input dimension unless ``num_projections``
(``--projections``) says otherwise (:func:`default_num_projections`)."""


def default_num_projections(num_dims: int) -> int:
    """J for a projected kernel on ``num_dims`` inputs: :data:`PROJECTIONS_PER_DIMENSION` per input.

    Example:
        >>> default_num_projections(26)
        52
    """
    return PROJECTIONS_PER_DIMENSION * num_dims


FULL_SET_KERNELS: tuple[str, ...] = ("additive-rbf", "additive-matern52", *PROJECTED_KERNELS)
"""The kernels that train on every training point on a CPU (``lazykern uci``'s large-N recipe,
:data:`lazykern.regression.recipe.LARGE_N`): sums of one-dimensional terms, whose products the structured
engine computes in :math:`O(N J)` and whose solves its grid preconditions; the others cost
:math:`O(N^2)` a product and train on a subset."""

LARGE_N_KERNEL = "dpa-matern52-learned"
"""The kernel ``lazykern uci`` trains on every training point on a CPU unless ``--kernel`` says
otherwise (``docs/large_n.rst`` has the measurements that chose it), with
:func:`large_n_num_projections` directions."""

LARGE_N_MAX_PROJECTIONS = 128
"""The most projections of :data:`LARGE_N_KERNEL` (:func:`large_n_num_projections`): its
preconditioner's build costs :math:`O(N J^2)` a training step."""


def large_n_num_projections(num_dims: int) -> int:
    """J for :data:`LARGE_N_KERNEL` on ``num_dims`` inputs: eight per input, at most
    :data:`LARGE_N_MAX_PROJECTIONS`.

    Example:
        >>> large_n_num_projections(8), large_n_num_projections(26)
        (64, 128)
    """
    return min(8 * num_dims, LARGE_N_MAX_PROJECTIONS)
