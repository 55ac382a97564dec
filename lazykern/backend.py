"""The engine chooser: which engine evaluates a kernel formula, picked once per call from one table.

Five engines evaluate the same formulas (:mod:`lazykern.formulas`), each one object behind the
contract of :class:`lazykern.engine.Engine` (``lazykern.<package>.engine.ENGINE``), listed in
:data:`ENGINES`:

* **cpu** (:mod:`lazykern.cpu`): lazykern's compiler with its C target: the formula is traced,
  differentiated and compiled to C that vectorizes across pairs; memory is O((N + M) * D). The
  default for CPU tensors whenever it can evaluate the formula: its lazy pass runs at the speed of
  hand-written C, well ahead of KeOps' CPU code, and it compiles in about a second where KeOps
  takes tens of seconds (measured: docs/performance.rst, "Benchmark suite" and "Compile flags").
* **keops** (:mod:`lazykern.keops.engine`): the inputs are wrapped as ``LazyTensor`` and the
  reduction is compiled once per formula; memory is O((N + M) * D), nothing pairwise is ever
  stored. The engine on GPUs where it passes its health check.
* **triton** (:mod:`lazykern.triton`): the compiler's GPU target, on GPUs where KeOps cannot run.
* **torch** (:mod:`lazykern.torch_engine`): row blocks of the pairwise expression are evaluated
  densely, at most :class:`lazykern.settings.chunk_bytes` at a time; the backward pass recomputes
  blocks instead of keeping them. Small problems, formulas that multiply matrices (the NTK's, which
  BLAS does best), and the dense blocks of engines without a dense output.
* **structured** (:mod:`lazykern.structured`): first-order additive Matérn and RBF kernels in
  O((N + M) d) per product, and a preconditioner of solves with them.

Every engine's second and higher derivatives come from the row blocks they share
(:mod:`lazykern.row_blocks`). :func:`choose_engine` picks an engine once per call of
:func:`pairwise_matmul`, :func:`pairwise_dense` and :func:`symmetric_gradients`, with its plan for
the call's tensors (a :class:`Choice`), and the call goes to that engine's method with the plan; a
caller that wants a particular engine (the NTK's backends) names it (:func:`preferred`). What else
the layers above ask of the engines comes through here too: products of a stored dense matrix
(:func:`dense_matmul`), preconditioners (:func:`preconditioner`) and the programs compiled so far
(:func:`program_counts`). Nothing above this module imports an engine.

Parameters arrive with ``(*batch, 1, K)`` shapes (the ``KernelLinearOperator`` convention) and are
handed to the engines in name order: compiled programs are keyed by the order of their parameters,
and callers build them in different orders (linear_operator sorts an operator's keyword arguments
when it rebuilds it), which would compile one formula twice. Formulas return a trailing axis of
size 1 per pair (as KeOps does), which the torch engine drops.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Mapping, NamedTuple

import torch
import torch.utils.checkpoint
from torch import Tensor

from . import settings
from .cpu.engine import ENGINE as CPU
from .engine import Engine, Plan, Preconditioner, ProgramCount
from .formulas import Formula, declared
from .keops.engine import ENGINE as KEOPS
from .row_blocks import row_blocks, rows_per_chunk
from .structured import grid
from .structured.engine import ENGINE as STRUCTURED
from .torch_engine.engine import ENGINE as TORCH
from .triton.engine import ENGINE as TRITON  # (imports no triton until a kernel runs)

#: The engines by name (:class:`lazykern.settings.engine`'s values besides ``"auto"``): the one
#: table :func:`choose_engine` picks from.
ENGINES: dict[str, Engine] = {engine.name: engine for engine in (CPU, KEOPS, TRITON, TORCH, STRUCTURED)}

__all__ = [
    "ENGINES",
    "PRECONDITIONER_MAX_RANK",
    "STRUCTURED_MIN_POINTS",
    "Choice",
    "choose_engine",
    "dense_matmul",
    "elementwise",
    "engine_for",
    "engine_report",
    "fold_columns",
    "pairwise_dense",
    "pairwise_matmul",
    "preconditioner",
    "preferred",
    "program_counts",
    "rows_per_chunk",
    "symmetric_gradients",
]

#: ``"auto"`` gives the structured engine the formulas it takes once both sides have this many
#: points: below it a pair engine's N x M work costs less than sorting and walking.
STRUCTURED_MIN_POINTS = 128

#: The most directions an engine's preconditioner keeps (the grid's,
#: :data:`lazykern.structured.grid.MAX_RANK`), for the policies above the chooser that ask for fewer.
PRECONDITIONER_MAX_RANK = grid.MAX_RANK


class Choice(NamedTuple):
    """The engine picked for one call, and its plan of the call's formula on its tensors
    (:meth:`lazykern.engine.Engine.supports`), handed to the engine's method; ``plan`` ``None``: not
    planned here (a forced or preferred engine), the engine plans when it runs and raises
    ``ValueError`` where it cannot."""

    engine: Engine
    plan: Plan | None = None


def _eager(fn: Callable) -> Callable:
    """Runs ``fn`` eagerly under ``torch.compile``: engines write into tensors through ``ctypes``,
    KeOps and Triton calls, which Dynamo cannot trace. Traced inside an autograd function (as
    ``linear_operator``'s ``Matmul`` calls the operators), the graph break returned a tensor other
    than the one the C reduction had written: uninitialised memory instead of ``K @ v``. The
    disabled twin is made on the first call under compilation: ``torch.compiler.disable`` imports
    Dynamo (and Triton with it), which a program that never compiles should not pay for."""
    eager: list[Callable] = []

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.compiler.is_compiling():
            if not eager:
                eager.append(torch.compiler.disable(fn, recursive=True))
            return eager[0](*args, **kwargs)
        return fn(*args, **kwargs)

    return run


def choose_engine(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Choice:
    """The engine (from :data:`ENGINES`) that evaluates ``formula`` on these tensors under the
    current :class:`lazykern.settings.engine`, with its plan of them (a :class:`Choice`: the
    question each engine is asked on the way, :meth:`~lazykern.engine.Engine.supports`, is not
    asked again by the call). Parameters are planned in name order, as the engines receive them.

    ``"auto"``: the torch engine for formulas that declare a ``pair_width`` (matrix products, best
    left to BLAS); else, for CPU tensors with at least :data:`STRUCTURED_MIN_POINTS` points on both
    sides, the structured engine where it takes the formula (:mod:`lazykern.structured`: first-order
    additive Matérn and RBF terms, O((N + M) d) per product); else the CPU engine for CPU tensors it
    supports (:mod:`lazykern.cpu.engine`;
    it compiles in about a second and beats the torch engine's row blocks at any size); else, when
    both sides have at least :class:`lazykern.settings.keops_min_size` points (a GPU compile costs
    seconds), KeOps, on a CUDA device only where it passes its health check
    (:func:`lazykern.keops.health.health`) and otherwise the Triton engine where it supports the
    formula (one warning names KeOps' problem and the engine used); below the threshold, the torch
    engine. Until a measurement on the device says otherwise, a healthy KeOps is preferred to Triton.
    A side with a single point always runs on the torch engine: KeOps reads a ``(..., 1, 1, D)``
    tensor as a parameter, not as one point, and would silently reduce over the wrong axis.

    A forced ``"keops"`` on a CUDA device where KeOps fails its health check raises one
    ``RuntimeError`` naming the cause (the process would otherwise die in KeOps' compile).
    :func:`engine_report` says which engine a device gets, and why.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(50, 3, dtype=torch.float64)
        >>> choose_engine(StationaryFormula("rbf"), x, x, {}).engine is ENGINES["cpu"]
        True
    """
    n, m = x1.shape[-2], x2.shape[-2]
    if n < 2 or m < 2:
        return Choice(TORCH)
    choice = settings.engine.value()
    on_gpu = x1.device.type == "cuda"
    if choice != "auto":
        if choice == KEOPS.name and on_gpu:
            KEOPS.require(x1.device)
        return Choice(ENGINES[choice])
    if declared(formula).pair_width is not None:
        return Choice(TORCH)
    params = _in_name_order(params)
    plan: Plan  # the engine's own kind: an additive form, a compiled reduction
    if min(n, m) >= STRUCTURED_MIN_POINTS and (plan := STRUCTURED.supports(formula, x1, x2, params)):
        return Choice(STRUCTURED, plan)
    if plan := CPU.supports(formula, x1, x2, params):
        return Choice(CPU, plan)
    threshold = settings.keops_min_size.value()
    if n < threshold or m < threshold:
        return Choice(TORCH)
    if not on_gpu:
        return Choice(KEOPS)
    return _gpu_engine(x1.device, formula, x1, x2, params)


def engine_for(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str:
    """The name (``"cpu"``, ``"keops"``, ``"triton"`` or ``"torch"``) of the engine
    :func:`choose_engine` picks for ``formula`` on these tensors.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(50, 3, dtype=torch.float64)
        >>> engine_for(StationaryFormula("rbf"), x, x, {})
        'cpu'
    """
    return choose_engine(formula, x1, x2, params).engine.name


def preferred(name: str, device: torch.device | str) -> Choice:
    """The engine a caller names for its reductions on ``device`` (the NTK's backends: ``"keops"``
    for symbolic reductions, ``"torch"`` for matrix products by BLAS, whatever
    :class:`lazykern.settings.engine` says), unplanned: that engine, except KeOps on a CUDA device
    where it fails its health check, where it is the choice of :func:`choose_engine` there: the
    Triton engine where it runs, else the torch engine (one warning names KeOps' problem and the
    engine used).

    Example:
        >>> preferred("keops", "cpu")
        Choice(engine=<lazykern engine 'keops'>, plan=None)
    """
    device = torch.device(device)
    engine = ENGINES[name]
    if engine is KEOPS and device.type == "cuda":
        return _gpu_engine(device, None, None, None, {})
    return Choice(engine)


def _gpu_engine(device: torch.device, formula: Formula | None, x1: Tensor | None, x2: Tensor | None,
                params: Mapping[str, Tensor]) -> Choice:
    """KeOps where it passes its health check on ``device``; else Triton where it runs (and takes
    ``formula``, when one is given), else torch, with one warning."""
    health = KEOPS.health(device)
    if health.ok:
        return Choice(KEOPS)
    plan = _triton_runs(formula, x1, x2, params)
    choice = Choice(TRITON, None if formula is None else plan) if plan else Choice(TORCH)
    _warn_once(f"{health.cause}; using the {choice.engine.name} engine instead")
    return choice


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        # _warn_once <- _gpu_engine <- choose_engine / preferred <- their caller <- its caller
        warnings.warn(message, RuntimeWarning, stacklevel=5)


def _triton_runs(formula: Formula | None, x1: Tensor | None, x2: Tensor | None,
                 params: Mapping[str, Tensor]) -> Plan | bool:
    """Whether lazykern's Triton engine runs here: its plan of ``formula`` on these tensors where a
    formula (and its tensors) is given, else whether it is available at all."""
    if not TRITON.available():  # Triton not installed, or neither a GPU nor its interpreter
        return False
    return True if formula is None or x1 is None or x2 is None else TRITON.supports(formula, x1, x2, params)


def engine_report(device: torch.device | str | None = None) -> str:
    """One line saying which engine kernel reductions on ``device`` get under the current
    :class:`lazykern.settings.engine`, and why (on a GPU: KeOps' health verdict, its cause and the
    stack it was checked on, and whether Triton runs). Runs KeOps' health check on a GPU
    (:func:`lazykern.keops.health.health`: a subprocess the first time a stack is seen).

    Args:
        device: a ``torch.device`` or its name; default: the first CUDA device if there is one, else the CPU.

    Example:
        >>> print(engine_report("cpu"))  # doctest: +ELLIPSIS
        cpu: engine 'auto': the structured engine for first-order additive Matérn and RBF kernels...
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    choice = settings.engine.value()
    if device.type != "cuda":
        if choice != "auto":
            return f"{device}: engine {choice!r} (forced by lazykern.settings.engine)"
        return (f"{device}: engine 'auto': the structured engine for first-order additive Matérn and RBF "
                f"kernels (and first-order Newton-Girard ones) from {STRUCTURED_MIN_POINTS} points, lazykern's CPU engine for the formulas it compiles, "
                "KeOps for the others, the torch engine for matrix-product formulas and for fewer than "
                f"{settings.keops_min_size.value()} points")
    if not torch.cuda.is_available():
        return f"{device}: no CUDA device visible to torch"
    health = KEOPS.health(device)
    stack = ", ".join(f"{k} {v}" for k, v in health.stack.items())
    keops = (f"KeOps passed its health check ({stack}{'; cached verdict' if health.cached else ''})" if health.ok
             else f"KeOps cannot run: {health.cause} ({stack})")
    triton = "Triton runs" if _triton_runs(None, None, None, {}) else "Triton is not available"
    if choice != "auto":
        picked = f"{choice!r} (forced by lazykern.settings.engine)"
    elif health.ok:
        picked = "'keops' (healthy KeOps is preferred until a measurement on this device says otherwise)"
    else:
        picked = ("'triton' for the formulas it supports, else 'torch'" if triton == "Triton runs"
                  else "'torch' (the chunked torch engine)")
    return f"{device}: {keops}; {triton}; engine {picked}"


def _in_name_order(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return dict(sorted(params.items()))


def fold_columns(vecs: Tensor, batch: torch.Size) -> Tensor | None:
    """``(*extra, *batch, N, C)`` right-hand sides as ``(*batch, N, C * prod(extra))``.

    A bilinear form summed over the extra (broadcast) batch dimensions of its vectors is the same
    form with those dimensions moved into the columns. ``None`` when ``vecs`` does not end in
    ``batch`` (it broadcasts *into* the operator's batch instead).
    """
    lead = vecs.dim() - 2 - len(batch)
    if lead < 0 or vecs.shape[lead:-2] != batch:
        return None
    n, c = vecs.shape[-2:]
    folded = vecs.reshape(-1, *batch, n, c).movedim(0, -1)
    return folded.reshape(*batch, n, -1)


@_eager
def symmetric_gradients(
    formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], left: Tensor, right: Tensor
) -> tuple[Tensor | None, Tensor | None, dict[str, Tensor | None]] | None:
    r"""Gradients of :math:`\sum_{ij} \langle l_i, r_j\rangle k(x^{(1)}_i, x^{(2)}_j)` in ONE reduction,
    for ``x1`` and ``x2`` holding the same points (K(X, X)), on the engine :func:`choose_engine`
    picks, where that engine fuses it (:meth:`lazykern.engine.Engine.fuses_symmetric_gradient`):
    the compiled engines any formula (:func:`lazykern.compiler.driver.symmetric_gradients`), KeOps
    symmetric formulas (:meth:`lazykern.keops.engine.KeOpsEngine.symmetric_gradients`), the
    structured engine the formulas it takes. The parameter gradients ride along in the same
    reduction.

    Args:
        x1, x2: ``(*batch, N, D)``, equal values (the caller checks); distinct tensors get distinct
            gradients, so a detached copy gets none and ``x1`` only its own share.
        params: ``(*batch, 1, K)`` tensor parameters.
        left, right: ``(*extra, *batch, N, C)``; extra leading dimensions are summed over.

    Returns:
        The gradients for ``x1``, ``x2`` (``None`` where not required; all of it in the first when
        ``x1 is x2``) and one per parameter; ``None`` instead when the chosen engine does not fuse
        this gradient or ``left``/``right`` do not end in the batch shape of ``x1`` (the caller
        then differentiates otherwise).
    """
    params = _in_name_order(params)
    batch = x1.shape[:-2]
    shape = torch.broadcast_shapes(left.shape, right.shape)
    left_columns, right_columns = fold_columns(left.expand(shape), batch), fold_columns(right.expand(shape), batch)
    if left_columns is None or right_columns is None:
        return None
    engine, plan = choose_engine(formula, x1, x2, params)
    if not engine.fuses_symmetric_gradient(formula):
        return None
    return engine.symmetric_gradients(formula, x1, x2, params, left_columns, right_columns, plan)


def _broadcast_rhs(x1: Tensor, rhs: Tensor) -> Tensor:
    batch = torch.broadcast_shapes(x1.shape[:-2], rhs.shape[:-2])
    return rhs.expand(*batch, *rhs.shape[-2:])


@_eager
def pairwise_matmul(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor,
                    choice: Choice | None = None) -> Tensor:
    """``K(x1, x2) @ rhs`` without storing K. ``x1``: (..., N, D), ``x2``: (..., M, D), ``rhs``: (..., M, C);
    ``choice``: the one :func:`choose_engine` (or :func:`preferred`) gave the caller for this call,
    if it asked already."""
    params = _in_name_order(params)
    vector = rhs.dim() == 1
    if vector:
        rhs = rhs.unsqueeze(-1)
    rhs = _broadcast_rhs(x1, rhs)
    engine, plan = choice or choose_engine(formula, x1, x2, params)
    out = engine.matmul(formula, x1, x2, params, rhs, plan)
    return out.squeeze(-1) if vector else out


@_eager
def dense_matmul(dense: Tensor, rhs: Tensor) -> Tensor:
    """``dense @ rhs`` for a stored kernel matrix: the engine's own product
    (:meth:`lazykern.engine.Engine.dense_matmul`; the CPU engine's few-column loop under ``"auto"``)
    where it has one for these tensors, else torch's ``matmul``."""
    choice = settings.engine.value()
    out = (CPU if choice == "auto" else ENGINES[choice]).dense_matmul(dense, rhs)
    return dense @ rhs if out is None else out


@_eager
def pairwise_dense(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
                   choice: Choice | None = None) -> Tensor:
    """The (..., N, M) kernel matrix, built in row blocks so N x M x D never exists. Entries below
    the normal floating-point range are written as zeros (they would slow LAPACK down tenfold).
    ``choice``: as for :func:`pairwise_matmul`.

    On the compiled engines the whole matrix is one compiled pass, as fast as one lazy pass. KeOps
    and the structured engine have no dense output: under ``"auto"`` their formulas are built by
    the CPU engine where it takes them, else by the torch engine's row blocks, so that the exact
    (Cholesky) path of the first-order additive and projected kernels on CPU tensors forms and
    differentiates its matrix in compiled passes (measured: docs/cpu_engine.rst, "Passes")."""
    params = _in_name_order(params)
    engine, plan = choice or choose_engine(formula, x1, x2, params)
    dense = engine.dense(formula, x1, x2, params, plan)
    if dense is None and settings.engine.value() == "auto" and engine is not CPU:
        plan = CPU.supports(formula, x1, x2, params)
        dense = CPU.dense(formula, x1, x2, params, plan) if plan else None
    return TORCH.dense(formula, x1, x2, params) if dense is None else dense


def preconditioner(formula: Formula, x: Tensor, params: Mapping[str, Tensor]) -> Callable[..., Preconditioner] | None:
    """A builder of a preconditioner of ``K(x, x) + diag(noise)`` from an engine's structure of
    ``formula`` (:meth:`lazykern.engine.Engine.preconditioner`: ``build(noise, max_rank=..., extent=...)``),
    from the first engine in :data:`ENGINES` that has one, whatever the engine setting (a
    preconditioner only approximates :math:`K`, and the solver applies it, not an engine's
    products); ``None`` where none has.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x, s = torch.rand(300, 2, dtype=torch.float64), {"scales": torch.ones(1, 2, dtype=torch.float64)}
        >>> build = preconditioner(StationaryFormula("rbf", additive=True), x, s)
        >>> P = build(torch.full((300,), 0.1, dtype=torch.float64))
        >>> v = torch.randn(300, 2, dtype=torch.float64)
        >>> torch.allclose(P.matmul(P.solve(v)), v), preconditioner(StationaryFormula("rbf"), x, {}) is None
        (True, True)
    """
    params = _in_name_order(params)
    builds = (engine.preconditioner(formula, x, params) for engine in ENGINES.values())
    return next((build for build in builds if build is not None), None)


def program_counts(device: torch.device | str) -> list[ProgramCount]:
    """What each engine that compiles has compiled and loaded so far for ``device``
    (:meth:`lazykern.engine.Engine.program_count`), in the order of :data:`ENGINES`: two calls
    bracket a warm-up (:func:`lazykern.warmup.precompile`). On a CUDA device it runs KeOps' health
    check first.

    Example:
        >>> [len(count.folders) for count in program_counts("cpu")]  # the C toolchain's, lazykern's KeOps folder
        [1, 1]
    """
    counts = (engine.program_count(torch.device(device)) for engine in ENGINES.values())
    return [count for count in counts if count.folders]


def elementwise(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """``k(x1[..., i, :], x2[..., i, :])`` for each i, in O(N * D): diagonals and gathered entries.

    In blocks of rows within ``settings.chunk_bytes``: the formula's temporaries are each as large
    as the inputs, and GPyTorch's pivoted-Cholesky preconditioner gathers ``rank x N`` entries at
    once, also in its backward pass (75,000 rows of OAK's 100 features at N = 5000, rank 15,
    float64: 360 MB of temporaries in one piece). With gradients, each block is checkpointed (its
    temporaries recomputed in the backward pass instead of kept)."""
    rows = x1.shape[-2]
    step = rows_per_chunk(1, max(x1.shape[-1], x2.shape[-1]), x1.element_size())
    if rows <= step:
        return formula(x1, x2, **params).squeeze(-1)
    names, values = tuple(params), tuple(params.values())

    def block(a: Tensor, b: Tensor, *vals: Tensor) -> Tensor:
        return formula(a, b, **dict(zip(names, vals))).squeeze(-1)

    if torch.is_grad_enabled() and any(t.requires_grad for t in (x1, x2, *values)):
        parts = [torch.utils.checkpoint.checkpoint(block, x1[..., r, :], x2[..., r, :], *values, use_reentrant=False)
                 for r in row_blocks(rows, step)]
        return torch.cat(parts, -1)
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2], *(p.shape[:-2] for p in values))
    out = x1.new_empty(*batch, rows)
    for r in row_blocks(rows, step):
        out[..., r] = block(x1[..., r, :], x2[..., r, :], *values)
    return out
