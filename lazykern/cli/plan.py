"""What ``lazykern uci`` and ``lazykern demo`` run: the kernel, whether it trains on every training
point, and the recipe, from the flags, the device and the size of the data.

On a CPU a dataset of more than :data:`~lazykern.cli.parser.CPU_DEFAULT_N_TRAIN` training points
trains on all of them by the large-N recipe (:data:`lazykern.regression.recipe.LARGE_N`) when the kernel is
one it fits (:data:`~lazykern.kernel_names.FULL_SET_KERNELS`; by default
:data:`~lazykern.kernel_names.LARGE_N_KERNEL`), and on a random subset of that many by the standard
recipe otherwise, or when ``--n-train`` says how many (``--max-degree`` and ``--plot`` without
``--kernel`` mean the standard default, :data:`~lazykern.kernel_names.DEFAULT_KERNEL`). Flags that
were given override the recipe's values; the others keep them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..kernel_names import DEFAULT_KERNEL, FULL_SET_KERNELS, LARGE_N_KERNEL, large_n_num_projections
from .parser import CHOLESKY_MAX, CPU_DEFAULT_N_TRAIN, DEFAULT_ITERS

if TYPE_CHECKING:  # imported with torch, once the options have been checked
    from ..regression import Recipe
    from ..regression.progress import JobProgress

__all__ = ["Plan", "job_progress", "plan"]


@dataclass(frozen=True)
class Plan:
    """The job a command line asks for.

    Attributes:
        kernel: the kernel's name.
        num_projections: J of a projected kernel (``None``: its default, or not projected).
        full_set: whether it trains on every training point by the large-N recipe.
        recipe: the :class:`~lazykern.regression.Recipe`.
    """

    kernel: str
    num_projections: int | None
    full_set: bool
    recipe: Recipe


def plan(args: argparse.Namespace, on_cpu: bool, available: int, num_dims: int) -> Plan:
    """The :class:`Plan` of ``uci`` or ``demo`` flags for data of ``available`` training points in
    ``num_dims`` dimensions, on a CPU or not.

    Example:
        >>> from lazykern.cli.parser import build_parser
        >>> p = plan(build_parser().parse_args(["uci", "kin40k"]), on_cpu=True, available=36000, num_dims=8)
        >>> p.kernel, p.num_projections, p.full_set, p.recipe.optimizer, p.recipe.warm_start_size
        ('dpa-matern52-learned', 64, True, 'adam', 2000)
        >>> p = plan(build_parser().parse_args(["uci", "kin40k", "--kernel", "rbf-ard", "--iters", "50"]),
        ...          on_cpu=True, available=36000, num_dims=8)
        >>> p.kernel, p.full_set, p.recipe.iters, p.recipe.max_cholesky_size
        ('rbf-ard', False, 50, 2000)
    """
    from ..regression import LARGE_N, NoiseFloor, Recipe

    large = args.command == "uci" and on_cpu and args.n_train is None and available > CPU_DEFAULT_N_TRAIN
    # --max-degree and --plot ask for the interaction kernels' components: the standard default's
    chosen = args.kernel or (DEFAULT_KERNEL if args.max_degree is not None or args.plot is not None else None)
    full_set = large and (chosen or LARGE_N_KERNEL) in FULL_SET_KERNELS
    kernel = chosen or (LARGE_N_KERNEL if full_set else DEFAULT_KERNEL)
    projections = args.projections
    if projections is None and full_set and kernel == LARGE_N_KERNEL:
        projections = large_n_num_projections(num_dims)
    base = LARGE_N if full_set else Recipe(iters=DEFAULT_ITERS, max_cholesky_size=CHOLESKY_MAX)
    given = {field: value for field, value in (
        ("optimizer", args.optimizer), ("iters", args.iters), ("lr", args.lr), ("tolerance", args.tolerance),
        ("warm_start_size", args.warm_start), ("warm_start_iters", args.warm_start_iters),
        ("max_cholesky_size", args.max_cholesky)) if value is not None}
    if full_set and args.warm_start is None and args.max_cholesky is not None:
        # the recipe's warm start is exact: no larger than the exact solves the flags allow
        given["warm_start_size"] = min(LARGE_N.warm_start_size, args.max_cholesky) or None
    recipe = replace(base, **given, noise_floor=NoiseFloor(args.noise_floor))
    return Plan(kernel, projections, full_set, recipe)


def job_progress(recipe: Recipe, kernel: str, n_train: int, *, enabled: bool) -> JobProgress:
    """One progress line for training and evaluating ``kernel`` on ``n_train`` points by ``recipe``:
    its phases in the order they run, each with its budget (the ARD fit and the subset's fit their
    L-BFGS iterations, training its steps; the prediction's solve and the variance check, on the
    conjugate-gradient path, estimated at a training step each until they run).

    Example:
        >>> from lazykern.regression import LARGE_N
        >>> progress = job_progress(LARGE_N, "dpa-matern52-learned", 36000, enabled=False)
        >>> [(p.name, p.budget) for p in progress.phases.values()]
        [('ARD fit', 150), ('subset fit', 150), ('training', 150), ('prediction', 1), ('variance check', 1)]
    """
    from ..regression.progress import JobProgress
    from ..regression.recipe import learns_projections

    phases: list[tuple] = []
    if (recipe.ard_start and learns_projections(kernel)) or recipe.noise_floor.policy == "ard" or (
            recipe.noise_floor.policy == "auto" and learns_projections(kernel)):
        phases.append(("ARD fit", recipe.warm_start_budget if recipe.ard_start else recipe.iters))
    if recipe.warms_start(n_train):
        phases.append(("subset fit", recipe.warm_start_budget))
    phases.append(("training", recipe.iters))
    if n_train > (recipe.max_cholesky_size or 0):
        phases += [("prediction", 1, "training"), ("variance check", 1, "training")]
    return JobProgress(phases, enabled=enabled)
