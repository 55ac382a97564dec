"""Which engine evaluates a kernel formula, and how.

Three engines evaluate the same formula (:mod:`lazykern.formulas`):

* **cpu**: lazykern's own reduction engine (:mod:`lazykern.cpu`): the formula is traced, differentiated
  and compiled to C that vectorizes across pairs; memory is O((N + M) * D). The default for CPU
  tensors whenever it can evaluate the formula: it runs the lazy pass at the speed of hand-written C
  (benchmarks/roofline.py), where KeOps' CPU code reaches 0.4-0.65 of it, and compiles in about a
  second instead of KeOps' 5-40 s.
* **KeOps**: the inputs are wrapped as ``LazyTensor`` and the reduction is compiled once per formula;
  memory is O((N + M) * D), nothing pairwise is ever stored. The engine on GPUs.
* **torch** (:mod:`lazykern.torch_engine`): row blocks of the pairwise expression are evaluated
  densely, at most :class:`lazykern.settings.chunk_bytes` at a time; the backward pass recomputes
  blocks instead of keeping them. Small problems, formulas that multiply matrices (the NTK's, which
  BLAS does best), and every engine's second and higher derivatives.

Parameters arrive with ``(*batch, 1, K)`` shapes (the ``KernelLinearOperator`` convention); this
module inserts the pairwise axis, and hands them to the engines in name order: compiled programs are
keyed by the order of their parameters, and callers build them in different orders (linear_operator
sorts an operator's keyword arguments when it rebuilds it), which would compile one formula twice.
Formulas return a trailing axis of size 1 per pair (as KeOps does), which the torch engine drops.
"""

from __future__ import annotations

import warnings
from typing import Callable, Mapping

import torch
import torch.utils.checkpoint
from torch import Tensor

from . import cpu, keops_cuda, settings, torch_engine
from . import triton as triton_engine  # (imports no triton until a kernel runs)
from .keops import keops_lazy_tensor, keops_session, padded_size
from .torch_engine import pairwise_params, rows_per_chunk

Formula = Callable[..., object]

__all__ = [
    "elementwise",
    "engine_for",
    "symbolic_engine",
    "engine_report",
    "fold_columns",
    "pairwise_dense",
    "pairwise_matmul",
    "rows_per_chunk",
    "symmetric_gradients",
]


def engine_for(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str:
    """The engine (``"cpu"``, ``"keops"``, ``"triton"`` or ``"torch"``) that evaluates ``formula`` on
    these tensors under the current :class:`lazykern.settings.engine`.

    ``"auto"``: the torch engine for formulas that declare a ``pair_width`` (matrix products, best
    left to BLAS); else the CPU engine for CPU tensors it supports (:func:`lazykern.cpu.supports`;
    it compiles in about a second and beats the torch engine's row blocks at any size); else, when
    both sides have at least :class:`lazykern.settings.keops_min_size` points (a GPU compile costs
    seconds), KeOps, on a CUDA device only where it passes its health check
    (:func:`lazykern.keops_cuda.health`) and otherwise the Triton engine where it supports the
    formula (one warning names KeOps' problem and the engine used); below the threshold, the torch
    engine. Until a measurement on the device says otherwise, a healthy KeOps is preferred to Triton.
    A side with a single point always runs on the torch engine: KeOps reads a ``(..., 1, 1, D)``
    tensor as a parameter, not as one point, and would silently reduce over the wrong axis.

    A forced ``"keops"`` on a CUDA device where KeOps fails its health check raises one
    ``RuntimeError`` naming the cause (the process would otherwise die in KeOps' compile).
    :func:`engine_report` says which engine a device gets, and why.
    """
    n, m = x1.shape[-2], x2.shape[-2]
    if n < 2 or m < 2:
        return "torch"
    choice = settings.engine.value()
    on_gpu = x1.device.type == "cuda"
    if choice == "keops" and on_gpu:
        keops_cuda.require(x1.device)
    if choice != "auto":
        return choice
    if hasattr(formula, "pair_width"):
        return "torch"
    if cpu.supports(formula, x1, x2, params):
        return "cpu"
    threshold = settings.keops_min_size.value()
    if n < threshold or m < threshold:
        return "torch"
    if not on_gpu:
        return "keops"
    return _gpu_engine(x1.device, formula, x1, x2, params)


def symbolic_engine(device: torch.device | str) -> str:
    """The engine of a symbolic reduction that its caller has already decided to run symbolically
    rather than by BLAS (the NTK's ``"keops"`` backend, whose formulas declare a ``pair_width``
    and so get the torch engine under ``"auto"``): KeOps off a GPU; on a CUDA device the choice of
    :func:`engine_for`, KeOps where it passes its health check, else the Triton engine where it
    runs, else the torch engine (one warning names KeOps' problem and the engine used).

    Example:
        >>> from lazykern import backend
        >>> backend.symbolic_engine("cpu")
        'keops'
    """
    device = torch.device(device)
    if device.type != "cuda":
        return "keops"
    return _gpu_engine(device, None, None, None, {})


def _gpu_engine(device: torch.device, formula: Formula | None, x1: Tensor | None, x2: Tensor | None,
                params: Mapping[str, Tensor]) -> str:
    health = keops_cuda.health(device)
    if health.ok:
        return "keops"
    engine = "triton" if _triton_runs(formula, x1, x2, params) else "torch"
    _warn_once(f"{health.cause}; using the {engine} engine instead")
    return engine


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        # _warn_once <- _gpu_engine <- engine_for / symbolic_engine <- their caller <- its caller
        warnings.warn(message, RuntimeWarning, stacklevel=5)


def _triton_runs(formula: Formula | None, x1: Tensor | None, x2: Tensor | None, params: Mapping[str, Tensor]) -> bool:
    """Whether lazykern's Triton engine runs here (and takes ``formula``, when one is given)."""
    if not triton_engine.available():  # Triton not installed, or neither a GPU nor its interpreter
        return False
    return formula is None or triton_engine.supports(formula, x1, x2, params)


def engine_report(device: torch.device | str | None = None) -> str:
    """One line saying which engine kernel reductions on ``device`` get under the current
    :class:`lazykern.settings.engine`, and why (on a GPU: KeOps' health verdict, its cause and the
    stack it was checked on, and whether Triton runs). Runs KeOps' health check on a GPU
    (:func:`lazykern.keops_cuda.health`: a subprocess the first time a stack is seen).

    Args:
        device: a ``torch.device`` or its name; default: the first CUDA device if there is one, else the CPU.

    Example:
        >>> print(engine_report("cpu"))  # doctest: +ELLIPSIS
        cpu: engine 'auto': lazykern's CPU engine for the formulas it compiles...
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    choice = settings.engine.value()
    if device.type != "cuda":
        if choice != "auto":
            return f"{device}: engine {choice!r} (forced by lazykern.settings.engine)"
        return (f"{device}: engine 'auto': lazykern's CPU engine for the formulas it compiles, KeOps for the "
                "others, the torch engine for matrix-product formulas and for fewer than "
                f"{settings.keops_min_size.value()} points")
    if not torch.cuda.is_available():
        return f"{device}: no CUDA device visible to torch"
    health = keops_cuda.health(device)
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


def _keops_product(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor) -> Tensor:
    c = rhs.shape[-1]
    padded = padded_size(c)
    if padded != c:
        rhs = torch.nn.functional.pad(rhs, (0, padded - c))
    with keops_session():
        K = formula(
            keops_lazy_tensor(x1.unsqueeze(-2)),
            keops_lazy_tensor(x2.unsqueeze(-3)),
            **{n: keops_lazy_tensor(p) for n, p in pairwise_params(params).items()},
        )
        out = K @ rhs.contiguous()
    return out[..., :c]


class _KeOpsMatmul(torch.autograd.Function):
    """KeOps' product with KeOps' own first derivatives; a backward pass that must be differentiable
    again (``create_graph=True``) takes the torch engine's (:func:`lazykern.torch_engine.vjp`), since
    KeOps cannot differentiate the vector-Jacobian product of lazykern's recurrence node.

    The forward reduction runs on leaves that stand for the inputs, and its graph (KeOps keeps only
    its inputs, nothing pairwise) is kept for the first-order backward, which then runs only KeOps'
    gradient reductions, as without this wrapper."""

    @staticmethod
    def forward(ctx, formula, names, x1, x2, *tensors):  # noqa: D102 - autograd protocol
        wanted = ctx.needs_input_grad[2:]
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(w) for t, w in zip((x1, x2, *tensors), wanted)]
            a, b, *values, rhs = leaves
            out = _keops_product(formula, a, b, dict(zip(names, values)), rhs)
        ctx.formula, ctx.names, ctx.graph = formula, names, (out, leaves)
        ctx.save_for_backward(x1, x2, *tensors)
        return out.detach()

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd protocol
        inputs, wanted = ctx.saved_tensors, ctx.needs_input_grad[2:]
        if torch.is_grad_enabled():
            return (None, None, *torch_engine.vjp(ctx.formula, ctx.names, inputs, wanted, grad_out))
        out, leaves = ctx.graph
        targets = [t for t, w in zip(leaves, wanted) if w]
        grads = iter(torch.autograd.grad(out, targets, grad_out, retain_graph=True, allow_unused=True))
        return (None, None, *(next(grads) if w else None for w in wanted))


def _keops_matmul(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor) -> Tensor:
    return _KeOpsMatmul.apply(formula, tuple(params), x1, x2, *params.values(), rhs)


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


def symmetric_gradients(
    formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], left: Tensor, right: Tensor
) -> tuple[Tensor | None, Tensor | None, dict[str, Tensor | None]] | None:
    r"""Gradients of :math:`\sum_{ij} \langle l_i, r_j\rangle k(x^{(1)}_i, x^{(2)}_j)` in ONE reduction,
    for ``x1`` and ``x2`` holding the same points (K(X, X)), on the engine :func:`engine_for` picks:
    the CPU engine (:func:`lazykern.cpu.symmetric_gradients`, any formula) or KeOps (symmetric
    formulas, as below).

    For a symmetric formula (``formula.symmetric``: :math:`k(u, v) = k(v, u)`, stationary or not),
    :math:`\partial k(u, v)/\partial v = \partial k(v, u)/\partial v` (first argument), so with
    :math:`g_{ij} = \partial k(x_i, x_j)/\partial x_i` the gradients are
    :math:`\sum_j \langle l_i, r_j\rangle g_{ij}` for ``x1`` and :math:`\sum_j \langle r_i, l_j\rangle g_{ij}`
    for ``x2``: reductions over j of the same derivative. When ``x1`` *is* ``x2`` (one tensor), one
    output carries their sum. The parameter gradients ride along in the same reduction
    (concatenated outputs, summed over i afterwards). KeOps' own backward would run one reduction
    per differentiated variable, each re-evaluating every exponential.

    Args:
        x1, x2: ``(*batch, N, D)``, equal values (the caller checks); distinct tensors get distinct
            gradients, so a detached copy gets none and ``x1`` only its own share.
        params: ``(*batch, 1, K)`` tensor parameters.
        left, right: ``(*extra, *batch, N, C)``; extra leading dimensions are summed over.

    Returns:
        The gradients for ``x1``, ``x2`` (``None`` where not required; all of it in the first when
        ``x1 is x2``) and one per parameter; ``None`` instead when ``left``/``right`` do not end in
        the batch shape of ``x1`` (the caller then differentiates otherwise).
    """
    params = _in_name_order(params)
    batch = x1.shape[:-2]
    shape = torch.broadcast_shapes(left.shape, right.shape)
    left, right = fold_columns(left.expand(shape), batch), fold_columns(right.expand(shape), batch)
    if left is None or right is None:
        return None
    engine = engine_for(formula, x1, x2, params)
    if engine in ("cpu", "triton"):
        # The compiled pass sums both occurrences of x: distinct tensors asking for their own
        # shares take the generic path.
        if x1 is not x2 and (x1.requires_grad or x2.requires_grad):
            return None
        grad, grads = (cpu if engine == "cpu" else triton_engine).symmetric_gradients(formula, x1, params, left, right)
        return grad, None, grads
    c = left.shape[-1]
    pad = padded_size(c) - c
    left, right = torch.nn.functional.pad(left, (0, pad)), torch.nn.functional.pad(right, (0, pad))
    wanted = {n: p for n, p in params.items() if p.requires_grad}
    same = x1 is x2
    want1, want2 = x1.requires_grad, (x2.requires_grad and not same)
    with keops_session():
        xi, xj = keops_lazy_tensor(x1.unsqueeze(-2)), keops_lazy_tensor(x1.unsqueeze(-3))
        lazy_params = {n: keops_lazy_tensor(p) for n, p in pairwise_params(params).items()}
        K = formula(xi, xj, **lazy_params)
        weight = keops_lazy_tensor(left.unsqueeze(-2)) | keops_lazy_tensor(right.unsqueeze(-3))
        if want2 or (want1 and same):
            transposed = keops_lazy_tensor(right.unsqueeze(-2)) | keops_lazy_tensor(left.unsqueeze(-3))
        parts, sizes = [], []
        if want1:
            parts.append(K.grad(xi, weight + transposed if same else weight))
            sizes.append(x1.shape[-1])
        if want2:
            parts.append(K.grad(xi, transposed))
            sizes.append(x1.shape[-1])
        for name, p in wanted.items():
            parts.append(K.grad(lazy_params[name], weight))
            sizes.append(p.shape[-1])
        if not parts:
            return None, None, {n: None for n in params}
        fused = parts[0]
        for part in parts[1:]:
            fused = fused.concat(part)
        out = fused.sum(dim=x1.dim() - 1)  # reduce over j: (*batch, N, sum(sizes))
    blocks = iter(out.split(sizes, dim=-1))
    grad1 = next(blocks) if want1 else None
    grad2 = next(blocks) if want2 else None
    grads = {
        n: (next(blocks).sum(-2, keepdim=True).reshape(p.shape) if n in wanted else None) for n, p in params.items()
    }
    return grad1, grad2, grads


def _broadcast_rhs(x1: Tensor, rhs: Tensor) -> Tensor:
    batch = torch.broadcast_shapes(x1.shape[:-2], rhs.shape[:-2])
    return rhs.expand(*batch, *rhs.shape[-2:])


def pairwise_matmul(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor) -> Tensor:
    """``K(x1, x2) @ rhs`` without storing K. ``x1``: (..., N, D), ``x2``: (..., M, D), ``rhs``: (..., M, C)."""
    params = _in_name_order(params)
    vector = rhs.dim() == 1
    if vector:
        rhs = rhs.unsqueeze(-1)
    rhs = _broadcast_rhs(x1, rhs)
    engine = engine_for(formula, x1, x2, params)
    if engine == "cpu":
        out = cpu.matmul(formula, x1, x2, params, rhs)
    elif engine == "triton":
        out = triton_engine.matmul(formula, x1, x2, params, rhs)
    elif engine == "keops":
        out = _keops_matmul(formula, x1, x2, params, rhs)
    else:
        out = torch_engine.rowwise(formula, x1, x2, params, rhs)
    return out.squeeze(-1) if vector else out


def dense_matmul(dense: Tensor, rhs: Tensor) -> Tensor:
    """``dense @ rhs`` for a stored kernel matrix: the CPU engine's few-column product
    (:mod:`lazykern.cpu.dense_matmul`) where it applies and the engine setting allows the CPU
    engine (``"auto"`` or ``"cpu"``), else torch's ``matmul``."""
    if settings.engine.value() in ("auto", "cpu") and cpu.supports_dense_matmul(dense, rhs):
        return cpu.dense_matmul(dense, rhs)
    return dense @ rhs


def pairwise_dense(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """The (..., N, M) kernel matrix, built in row blocks so N x M x D never exists. Entries below
    the normal floating-point range are written as zeros (they would slow LAPACK down tenfold).

    On the CPU engine the whole matrix is one compiled pass (measured: as fast as one lazy pass);
    KeOps has no dense output, so its formulas are built by the torch engine's row blocks."""
    params = _in_name_order(params)
    engine = engine_for(formula, x1, x2, params)
    if engine in ("cpu", "triton"):  # subnormals flushed in the compiled pass
        return (cpu if engine == "cpu" else triton_engine).dense(formula, x1, x2, params)
    return torch_engine.rowwise(formula, x1, x2, params, None)


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
                 for r in torch_engine.row_blocks(rows, step)]
        return torch.cat(parts, -1)
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2], *(p.shape[:-2] for p in values))
    out = x1.new_empty(*batch, rows)
    for r in torch_engine.row_blocks(rows, step):
        out[..., r] = block(x1[..., r, :], x2[..., r, :], *values)
    return out
