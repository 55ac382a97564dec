"""Compile a kernel's reductions ahead of time (a warm-up before training or serving).

The function is ``lazykern.precompile`` (:func:`precompile`); this module holds it and its report.
What was compiled and loaded, and where, it asks of the engines through the chooser
(:func:`lazykern.backend.program_counts`), never of an engine's folders itself.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from typing import Callable, Iterator, NamedTuple, Sequence

import linear_operator
import torch
from gpytorch.kernels import Kernel

from . import backend, settings
from .engine import ProgramCount
from .validation import check_positive_int, check_positive_ints

__all__ = ["precompile", "PrecompileReport"]

# Inputs for the warm-up: the compiled formulas depend on dimensions and dtype, never on N.
_WARMUP_POINTS = 64
# How often the watcher behind ``on_compile`` looks for a compile that started.
_WATCH_INTERVAL_S = 0.1


class PrecompileReport(NamedTuple):
    """What one :func:`precompile` call did.

    Attributes:
        folder: the cache folder holding the programs this call compiled or loaded: the CPU
            engine's folder (:func:`lazykern.native.cache_folder`), lazykern's KeOps build folder
            (:func:`lazykern.keops.build_folder`) or, for a kernel on a GPU, KeOps' own build folder
            (each engine names its own: :meth:`lazykern.engine.Engine.program_count`); the common
            parent of those the call used (of all of them when it used none).
        compiled: programs compiled by this call (every engine's).
        cached: programs this call loaded, compiled earlier (by any process) into the cache; programs
            this process had loaded already count in neither.
        seconds: wall time of the call.
    """

    folder: str
    compiled: int
    cached: int
    seconds: float


def _infer_dims(kernel: Kernel) -> int | None:
    for module in kernel.modules():
        if getattr(module, "active_dims", None) is not None:
            return int(module.active_dims.max()) + 1
        for name in ("num_dims", "ard_num_dims"):
            value = getattr(module, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _entries(folder: str) -> set[str]:
    try:
        return set(os.listdir(folder))
    except FileNotFoundError:
        return set()


@contextlib.contextmanager
def _watch(folders: list[str], on_compile: Callable[[str], None] | None) -> Iterator[None]:
    """Calls ``on_compile(folder)`` once, from a helper thread, with the first of ``folders`` in
    which an entry appears: an engine writes a program's source (and its lock) into its folders
    before compiling it (:class:`lazykern.engine.ProgramCount`)."""
    if on_compile is None:
        yield
        return
    before = {f: _entries(f) for f in folders}
    stop = threading.Event()
    called = threading.Event()

    def compiling() -> str | None:
        return next((f for f, names in before.items() if _entries(f) - names), None)

    def poll() -> None:
        while not stop.wait(_WATCH_INTERVAL_S):
            found = compiling()
            if found is not None:
                called.set()
                on_compile(found)
                return

    watcher = threading.Thread(target=poll, name="lazykern-precompile-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
    found = None if called.is_set() else compiling()
    if found is not None:  # a compile too quick for the watcher: still said, once
        on_compile(found)


def precompile(
    kernel: Kernel,
    *,
    dtype: torch.dtype = torch.float32,
    dims: int | None = None,
    columns: Sequence[int] = (1, 16),
    gradients: bool = True,
    points: int | None = None,
    on_compile: Callable[[str], None] | None = None,
) -> PrecompileReport:
    r"""Compile the reductions that training and prediction with ``kernel`` will run, on the engine
    they will run on (:func:`lazykern.backend.engine_for`: lazykern's CPU engine for CPU tensors it
    supports, KeOps otherwise and on GPUs; under ``lazykern.settings.engine("keops")``, KeOps).

    One lazy matvec :math:`K(X, X)\,V` per entry of ``columns`` (the number of right-hand sides;
    matvecs are padded to 1, 2, 4, 8 or a multiple of 16 columns, so ``16`` covers GPyTorch's CG
    with up to 15 probe vectors and ``1`` covers prediction), and, with ``gradients``, the
    reductions of :math:`\partial (U^\top K V) / \partial \theta` for every hyperparameter
    :math:`\theta` of ``kernel`` that requires grad (what one marginal-likelihood backward pass
    compiles), and the dense build of :math:`K(X, X)` with, under ``gradients``, its backward
    pass (what GPyTorch's Cholesky path asks for), and the product of a stored dense matrix with a
    few columns (CG on the dense cache, ``lazykern.backend.dense_matmul``).
    Formulas depend on ``dtype``, the input dimension and the batch shape, never on the number of
    points, so this runs on a few random points and takes only compile time, once per formula
    (what a compile costs on each engine: docs/performance.rst, "Compile flags"). Safe to call from
    several processes at once (compiles are serialized by a file lock). The kernel's parameters
    and their ``.grad`` are left unchanged.

    Args:
        kernel: a GPyTorch kernel built from lazykern kernels (e.g. ``ScaleKernel(AdditiveStructureKernel(...))``).
        dtype: ``torch.float32`` or ``torch.float64`` (the dtype you will train in; a float32
            model that :func:`lazykern.regression.train` trains by L-BFGS is refined in float64,
            so ``lazykern uci`` precompiles both).
        dims: number of input columns; inferred from ``active_dims``, ``num_dims`` or
            ``ard_num_dims`` when omitted.
        columns: right-hand-side counts to compile for.
        gradients: also compile the hyperparameter-gradient reductions.
        points: the number of training points the kernel will see. Default: as many as it takes for
            KeOps to run formulas the CPU engine does not (:class:`lazykern.settings.keops_min_size`);
            below that threshold those formulas run on the torch engine and nothing is compiled for them.
        on_compile: called once with the folder being compiled into, from a helper thread, as soon
            as the first compile of this call starts (e.g. to tell a user why they wait); not called when
            everything is cached.

    Returns:
        A :class:`PrecompileReport`: the cache folder, the programs compiled and found cached, the seconds taken.

    Example:
        >>> import gpytorch, lazykern
        >>> base = lazykern.RBFKernel(ard_num_dims=26)
        >>> kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=26))
        >>> report = lazykern.precompile(kernel, dtype=torch.float32)  # doctest: +SKIP
        >>> report.compiled, report.cached  # doctest: +SKIP
        (5, 0)
    """
    start = time.perf_counter()
    dims, columns = _checked(kernel, dtype, dims, columns, points, on_compile)
    # A copy, so that converting to ``dtype`` neither rounds nor moves the caller's parameters.
    kernel = copy.deepcopy(kernel).to(dtype)
    device = next((p.device for p in kernel.parameters()), torch.device("cpu"))
    before = backend.program_counts(device)  # on a GPU after KeOps' health check, whose probe compiles too
    watched = [folder for count in before for folder in count.folders]
    # A few points stand for many: the size threshold of KeOps is lifted unless the real problem is below it.
    lift = points is None or points >= settings.keops_min_size.value()
    sizes = settings.keops_min_size(0) if lift else contextlib.nullcontext()
    with _watch(watched, on_compile), sizes, settings.max_dense_bytes(0):
        _run(kernel, dims, columns, gradients, dtype, device)
    return _report(before, backend.program_counts(device), watched, time.perf_counter() - start)


def _checked(kernel: Kernel, dtype: torch.dtype, dims: int | None, columns: Sequence[int], points: int | None,
             on_compile: Callable[[str], None] | None) -> tuple[int, tuple[int, ...]]:
    """:func:`precompile`'s arguments checked: the input dimension (inferred where not given) and the columns."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a gpytorch.kernels.Kernel, got {type(kernel).__name__}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if dims is None:
        dims = _infer_dims(kernel)
        if dims is None:
            raise ValueError("dims is required: the kernel has no active_dims, num_dims or ard_num_dims to infer it from")
    check_positive_int("dims", dims)
    columns = check_positive_ints("columns", columns)
    if points is not None:
        check_positive_int("points", points)
    if on_compile is not None and not callable(on_compile):
        raise TypeError(f"on_compile must be callable or None, got {type(on_compile).__name__}")
    return dims, columns


def _run(kernel: Kernel, dims: int, columns: Sequence[int], gradients: bool, dtype: torch.dtype,
         device: torch.device) -> None:
    """The products, gradients and dense build of :func:`precompile` on a few random points."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*kernel.batch_shape, _WARMUP_POINTS, dims, generator=generator, dtype=dtype).to(device)
    params = [p for p in kernel.parameters() if p.requires_grad]
    with torch.set_grad_enabled(gradients and bool(params)):
        for c in sorted(set(columns)):
            rhs = torch.randn(*x.shape[:-1], c, generator=generator, dtype=dtype).to(device)
            out = kernel(x, x) @ rhs
            if out.requires_grad:
                torch.autograd.grad(out.sum(), params, allow_unused=True)
        dense = kernel(x, x).to_dense()
        if dense.requires_grad:
            torch.autograd.grad(dense.sum(), params, allow_unused=True)
        # CG's products on the dense cache (the CPU engine's few-column loop, where it applies).
        backend.dense_matmul(dense.detach(), torch.ones(*dense.shape[:-1], 2, dtype=dtype, device=device))
    _precondition(kernel, x)


def _precondition(kernel: Kernel, x: torch.Tensor) -> None:
    """Build and apply the preconditioner CG would get for ``K(X, X)`` plus noise (an engine's own,
    such as the structured engine's grid, whose programs compile on first use), whatever the size."""
    with torch.no_grad(), linear_operator.settings.min_preconditioning_size(0):
        noisy = kernel(x, x).evaluate_kernel().add_diagonal(torch.tensor(0.1, dtype=x.dtype, device=x.device))
        closure = noisy._preconditioner()[0]
        if closure is not None:
            closure(torch.ones(*x.shape[:-1], 1, dtype=x.dtype, device=x.device))


def _report(before: list[ProgramCount], after: list[ProgramCount], watched: list[str], seconds: float) -> PrecompileReport:
    """The report of a warm-up from the engines' counts before and after it: the folder is the
    common parent of those of the engines that compiled or loaded something (of all watched folders
    when none did)."""
    compiled = sum(a.compiled - b.compiled for a, b in zip(after, before))
    loaded = sum(a.loaded - b.loaded for a, b in zip(after, before))
    used = [folder for a, b in zip(after, before) if a != b for folder in a.folders]
    return PrecompileReport(os.path.commonpath(used or watched), compiled, max(loaded - compiled, 0), seconds)
