r"""The CPU engine's public functions: products, dense blocks and fused gradients of a formula.

Each function traces the formula once per structure (``lazykern.cpu.trace``), differentiates
it symbolically where gradients are asked for (``lazykern.cpu.grad``), generates and compiles
one reduction per pass (``lazykern.cpu.codegen``, ``lazykern.cpu.build``) and runs it on
the tensors. Shapes follow :mod:`lazykern.backend`: ``x1`` ``(..., N, D1)``, ``x2``
``(..., M, D2)``, parameters ``(..., 1, K)``, right-hand sides ``(..., M, C)``; batch dimensions
broadcast.

The passes of a product :math:`Y = K V` and its gradients (:math:`\bar Y` the incoming gradient):

* forward, over rows of ``x1``: :math:`Y_i = \sum_j k(x_i, z_j) V_j`;
* backward, over rows of ``x1``: :math:`\sum_j \langle \bar Y_i, V_j\rangle\, \partial k/\partial x_i`
  and the per-row parts of :math:`\partial/\partial\theta` (summed over rows afterwards);
* backward, over rows of ``x2`` (only when ``x2`` or ``V`` needs a gradient):
  :math:`\sum_i \langle \bar Y_i, V_j\rangle\, \partial k/\partial z_j` and
  :math:`\bar V_j = \sum_i k(x_i, z_j) \bar Y_i`, in the same loop.

Each backward pass evaluates the kernel's exponentials once per pair for all its outputs (KeOps'
autodiff runs one reduction per differentiated variable).
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
from typing import Callable, Mapping

import torch
from torch import Tensor

from .. import torch_engine
from . import build
from .codegen import Reduction, compact
from .grad import adjoints
from .trace import Graph, Unsupported, trace

Formula = Callable[..., object]

__all__ = ["matmul", "dense", "symmetric_gradients", "supports"]

_DTYPES = {torch.float32: "float", torch.float64: "double"}
# Dimension-major rows are padded to a multiple of this many entries (64-byte aligned rows).
_ALIGN = 16
_PAIRS_PER_THREAD = 1 << 15


# ---------------------------------------------------------------------------- programs
def _spec(params: Mapping[str, Tensor]) -> tuple[tuple[str, int], ...]:
    return tuple((name, p.shape[-1]) for name, p in params.items())


def _program(formula: Formula, job: str, d1: int, d2: int, pspec: tuple, dtype: str, want: tuple[str, ...] = ()) -> Reduction:
    """The reduction of ``job`` (cached per formula when the formula is hashable)."""
    try:
        return _cached_program(formula, job, d1, d2, pspec, dtype, want)
    except TypeError as err:  # an unhashable formula object: build it every time (tracing is cheap)
        if "unhashable" not in str(err):
            raise
        return _build_program(formula, job, d1, d2, pspec, dtype, want)


@functools.lru_cache(maxsize=1024)
def _cached_program(formula: Formula, job: str, d1: int, d2: int, pspec: tuple, dtype: str, want: tuple) -> Reduction:
    return _build_program(formula, job, d1, d2, pspec, dtype, want)


def _build_program(formula: Formula, job: str, d1: int, d2: int, pspec: tuple, dtype: str, want: tuple) -> Reduction:
    """Jobs: ``"mm"`` (:math:`K V`), ``"mmT"`` (:math:`K^\\top V`), ``"dense"`` (rows of K),
    ``"gradA"``/``"gradB"`` (backward passes over rows of ``x1``/``x2``, weights from dot products
    of column arrays), ``"gradA-pair"``/``"gradB-pair"`` (weights from a dense gradient matrix),
    ``"sym"`` (the fused gradient of :math:`\\sum_{ij} \\langle l_i, r_j\\rangle k(x_i, x_j)`),
    ``"sym-pair"`` (the same with weights from a dense gradient matrix :math:`G` and its transpose).
    ``want`` names the gradients a backward pass computes: ``"x"`` (its outer input), parameter
    names, ``"rhs"`` (``gradB`` only: :math:`K^\\top \\bar Y`)."""
    g = Graph()
    params = dict(pspec)
    names = tuple(f"p:{n}" for n in params)
    transposed = job in ("mmT", "gradB", "gradB-pair")
    if transposed:  # outer rows are x2: the formula's first input is the inner side
        root = trace(formula, g, "i", "o", params, d1, d2)
        d_outer = d2
    else:
        root = trace(formula, g, "o", "i", params, d1, d2)
        d_outer = d1
    base = dict(outer=("o",), inner=("i",), params=names, dtype=dtype)
    if job in ("mm", "mmT"):
        nodes, new = compact(g, [root])
        return Reduction(nodes=nodes, weights=(), outer_vecs=0, inner_vecs=1, sums=(), matmul=(new[root], 0), store=None, **base)
    if job == "dense":
        nodes, new = compact(g, [root])
        return Reduction(nodes=nodes, weights=(), outer_vecs=0, inner_vecs=0, sums=(), matmul=None, store=new[root], **base)
    o = g.leaf("o", d_outer)
    leaves = {"x": o, **{n: g.leaf(f"p:{n}", w) for n, w in params.items()}}
    w0 = g.leaf("w0", 1)
    if job in ("sym", "sym-pair"):
        w1 = g.leaf("w1", 1)
        pair = job == "sym-pair"
        weights = (("w0", "pair"), ("w1", "pair")) if pair else (("w0", "dot", 0, 0), ("w1", "dot", 1, 1))
        if getattr(formula, "symmetric", False):  # dk(x_j, x_i)/dx_i = dk(x_i, x_j)/dx_i
            seeds_x = [(root, g.binary("add", w0, w1))]
        else:
            seeds_x = [(root, w0), (trace(formula, g, "i", "o", params, d1, d2), w1)]
        outs = []
        if "x" in want:
            outs.append(adjoints(g, seeds_x, [o])[o])
        pgrads = adjoints(g, [(root, w0)], [leaves[n] for n in params])
        outs += [pgrads[leaves[n]] for n in params if n in want]
        ovecs = ivecs = 0 if pair else 2
    else:
        pair = job.endswith("-pair")
        weights = (("w0", "pair"),) if pair else (("w0", "dot", 0, 0),)
        grads = adjoints(g, [(root, w0)], [leaves[n] for n in ("x", *params)])
        outs = [grads[leaves[n]] for n in ("x", *params) if n in want]
        ovecs = ivecs = 0 if pair else 1
    # A leaf the kernel does not depend on gets an explicit zero: the output layout stays fixed.
    outs = [g.const(0.0, g.width(leaves[n])) if e is None else g.expand(e, g.width(leaves[n]))
            for e, n in zip(outs, [n for n in ("x", *params) if n in want])]
    matmul_root = root if (job == "gradB" and "rhs" in want) else None
    nodes, new = compact(g, outs + ([matmul_root] if matmul_root is not None else []))
    return Reduction(
        nodes=nodes,
        weights=weights,
        outer_vecs=ovecs,
        inner_vecs=ivecs,
        sums=tuple(new[e] for e in outs),
        matmul=None if matmul_root is None else (new[matmul_root], 0),
        store=None,
        **base,
    )


# ---------------------------------------------------------------------------- buffers
def _flat(t: Tensor, batch: torch.Size, nb: int) -> tuple[Tensor, int, int]:
    """``t`` broadcast to ``batch`` as ``(nb, rows, width)``: the base tensor and its batch stride
    (0 where ``t`` is shared by every batch entry, so it is never copied)."""
    t = t.expand(*batch, *t.shape[-2:]).reshape(nb, *t.shape[-2:])
    if nb == 1 or t.stride(0) == 0:
        return t[0].contiguous(), 0, 1
    t = t.contiguous()
    return t, t[0].numel(), nb


def _rows(t: Tensor, batch: torch.Size, nb: int) -> tuple[Tensor, int]:
    base, stride, _ = _flat(t, batch, nb)
    return base, stride


def _columns(t: Tensor, batch: torch.Size, nb: int, mp: int) -> tuple[Tensor, int]:
    """``(..., M, W)`` as dimension-major ``(nb', W, mp)`` rows, zero-padded to ``mp``."""
    base, stride, count = _flat(t, batch, nb)
    base = base.reshape(count, *t.shape[-2:])
    out = base.new_zeros(count, t.shape[-1], mp)
    out[:, :, : t.shape[-2]] = base.transpose(-1, -2)
    return out, (out[0].numel() if stride else 0)


def _run(red: Reduction, buffers: dict[str, tuple[Tensor, int]], nb: int, n: int, m: int, mp: int, c: int) -> None:
    fn = build.load(red)
    roles = red.operands()
    ptrs = (ctypes.c_void_p * len(roles))(*[buffers[r][0].data_ptr() for r in roles])
    strides = (ctypes.c_int64 * len(roles))(*[buffers[r][1] for r in roles])
    fn(ptrs, strides, nb, n, m, mp, c, _threads(nb * n * m))


def _threads(pairs: int) -> int:
    """torch's thread count, but one thread per ``_PAIRS_PER_THREAD`` pairs at most: waking a
    thread costs more than a small reduction (tens of milliseconds on a loaded machine)."""
    return max(1, min(torch.get_num_threads(), pairs // _PAIRS_PER_THREAD))


def _batch(*tensors: Tensor) -> torch.Size:
    return torch.broadcast_shapes(*(t.shape[:-2] for t in tensors))


def _padded(m: int) -> int:
    return max(_ALIGN, -(-m // _ALIGN) * _ALIGN)


def _param_buffers(params: Mapping[str, Tensor], batch: torch.Size, nb: int) -> dict[str, tuple[Tensor, int]]:
    return {f"param:p:{n}": _rows(p.detach(), batch, nb) for n, p in params.items()}


def _out(batch: torch.Size, n: int, w: int, like: Tensor) -> tuple[Tensor, int]:
    """A ``(*batch, n, w)`` result and its batch stride, allocated in its final shape: a view
    returned by an autograd Function may not be modified in place."""
    return like.new_empty(*batch, n, w), n * w


# ---------------------------------------------------------------------------- forward passes
def _forward_matmul(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor, transposed: bool) -> Tensor:
    """``K @ rhs`` (``transposed``: ``K^T @ rhs``, rhs over rows of ``x1``), batch of ``_batch``."""
    batch = _batch(x1, x2, rhs, *params.values())
    nb = batch.numel()
    outer, inner = (x2, x1) if transposed else (x1, x2)
    n, m, c = outer.shape[-2], inner.shape[-2], rhs.shape[-1]
    mp = _padded(m)
    red = _program(formula, "mmT" if transposed else "mm", x1.shape[-1], x2.shape[-1], _spec(params), _DTYPES[x1.dtype])
    out = _out(batch, n, c, x1)
    buffers = {
        "outer:o": _rows(outer.detach(), batch, nb),
        "inner:i": _columns(inner.detach(), batch, nb, mp),
        "ivec:0": _columns(rhs.detach(), batch, nb, mp),
        "out:matmul": out,
        **_param_buffers(params, batch, nb),
    }
    _run(red, buffers, nb, n, m, mp, c)
    return out[0]


def _forward_dense(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    batch = _batch(x1, x2, *params.values())
    nb = batch.numel()
    n, m = x1.shape[-2], x2.shape[-2]
    mp = _padded(m)
    red = _program(formula, "dense", x1.shape[-1], x2.shape[-1], _spec(params), _DTYPES[x1.dtype])
    out = _out(batch, n, m, x1)
    buffers = {
        "outer:o": _rows(x1.detach(), batch, nb),
        "inner:i": _columns(x2.detach(), batch, nb, mp),
        "out:store": out,
        **_param_buffers(params, batch, nb),
    }
    _run(red, buffers, nb, n, m, mp, 1)
    return out[0]


# ---------------------------------------------------------------------------- backward passes
def _grad_pass(
    formula: Formula,
    job: str,
    x1: Tensor,
    x2: Tensor,
    params: Mapping[str, Tensor],
    want: tuple[str, ...],
    batch: torch.Size,
    vecs: dict[str, Tensor],
) -> tuple[Tensor | None, Tensor | None, dict[str, Tensor]]:
    """Run one backward pass; returns (gradient of its outer input, K^T-product or None, the
    per-parameter gradients), each ``(*batch, rows, width)``."""
    nb = batch.numel()
    transposed = job.startswith("gradB")
    outer, inner = (x2, x1) if transposed else (x1, x2)
    n, m = outer.shape[-2], inner.shape[-2]
    mp = _padded(m)
    red = _program(formula, job, x1.shape[-1], x2.shape[-1], _spec(params), _DTYPES[x1.dtype], want)
    buffers = {
        "outer:o": _rows(outer.detach(), batch, nb),
        "inner:i": _columns(inner.detach(), batch, nb, mp),
        **_param_buffers(params, batch, nb),
    }
    c = 1
    if job.endswith("-pair"):
        for k, weight in enumerate(vecs["pairs"]):
            buffers[f"pair:w{k}"] = _rows(weight, batch, nb)
    else:
        for k, (ov, iv) in enumerate(vecs["dots"]):
            buffers[f"ovec:{k}"] = _rows(ov, batch, nb)
            buffers[f"ivec:{k}"] = _columns(iv, batch, nb, mp)
            c = ov.shape[-1]
    sums = _out(batch, n, red.sums_width, x1) if red.sums else None
    if sums is not None:
        buffers["out:sums"] = sums
    product = None
    if red.matmul is not None:
        product = _out(batch, n, c, x1)
        buffers["out:matmul"] = product
    _run(red, buffers, nb, n, m, mp, c)
    grads: dict[str, Tensor] = {}
    if sums is not None:
        names = [w for w in ("x", *params) if w in want]
        widths = [outer.shape[-1] if w == "x" else params[w].shape[-1] for w in names]
        for name, part in zip(names, sums[0].split(widths, dim=-1)):
            grads[name] = part
    return grads.pop("x", None), (None if product is None else product[0]), grads


def _param_grads(params: Mapping[str, Tensor], grads: dict[str, Tensor], batch: torch.Size) -> list[Tensor | None]:
    out = []
    for name, p in params.items():
        g = grads.get(name)
        out.append(None if g is None else g.sum(-2).reshape(*batch, 1, p.shape[-1]).sum_to_size(p.shape))
    return out


def _input_grad(g: Tensor | None, t: Tensor, batch: torch.Size) -> Tensor | None:
    return None if g is None else g.reshape(*batch, *t.shape[-2:]).sum_to_size(t.shape)


def _differentiable_backward(ctx, inputs: tuple[Tensor, ...], grad_out: Tensor) -> list[Tensor | None]:
    """The gradients of a backward pass that must itself be differentiable (``create_graph=True``:
    Hessians, Hessian-vector products), for ``inputs`` ``(x1, x2, *parameters[, rhs])``.

    The compiled passes give first derivatives only; the derivative of a gradient pass is another
    reduction with other weights, so these come from the torch engine's row blocks, differentiable
    to any order (:func:`lazykern.torch_engine.vjp`): exact, and one block in memory at a time."""
    needs = ctx.needs_input_grad[2:]
    if len(inputs) > 2 + len(ctx.names):  # a product: autograd's order is x1, x2, rhs, *parameters
        needs = (needs[0], needs[1], *needs[3:], needs[2])
    return torch_engine.vjp(ctx.formula, ctx.names, inputs, needs, grad_out)


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, formula, names, x1, x2, rhs, *values):  # noqa: D102 - autograd protocol
        params = dict(zip(names, values))
        ctx.formula, ctx.names = formula, names
        ctx.save_for_backward(x1, x2, rhs, *values)
        return _forward_matmul(formula, x1, x2, params, rhs, transposed=False)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd protocol
        x1, x2, rhs, *values = ctx.saved_tensors
        need_x1, need_x2, need_rhs, *need_p = ctx.needs_input_grad[2:]
        if torch.is_grad_enabled():  # create_graph=True: see _differentiable_backward
            gx1, gx2, *gp, grhs = _differentiable_backward(ctx, (x1, x2, *values, rhs), grad_out)
            return (None, None, gx1, gx2, grhs, *gp)
        params = dict(zip(ctx.names, values))
        wanted_p = tuple(n for n, w in zip(ctx.names, need_p) if w)
        batch = _batch(x1, x2, rhs, grad_out, *values)
        grad_out = grad_out.contiguous()
        gx1 = gx2 = grhs = None
        grads: dict[str, Tensor] = {}
        a_runs = need_x1 or (wanted_p and not (need_x2 or need_rhs))
        if a_runs:
            want = (("x",) if need_x1 else ()) + wanted_p
            gx1, _, grads = _grad_pass(ctx.formula, "gradA", x1, x2, params, want, batch, {"dots": [(grad_out, rhs.detach())]})
        if need_x2 or need_rhs:
            want = (("x",) if need_x2 else ()) + (() if a_runs else wanted_p) + (("rhs",) if need_rhs else ())
            gx2, grhs, more = _grad_pass(ctx.formula, "gradB", x1, x2, params, want, batch, {"dots": [(rhs.detach(), grad_out)]})
            grads.update(more)
        return (
            None,
            None,
            _input_grad(gx1, x1, batch),
            _input_grad(gx2, x2, batch),
            _input_grad(grhs, rhs, batch),
            *_param_grads(params, grads, batch),
        )


class _Dense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, formula, names, x1, x2, *values):  # noqa: D102 - autograd protocol
        ctx.formula, ctx.names, ctx.same_inputs = formula, names, x1 is x2
        ctx.save_for_backward(x1, x2, *values)
        return _forward_dense(formula, x1, x2, dict(zip(names, values)))

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd protocol
        x1, x2, *values = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: see _differentiable_backward
            return (None, None, *_differentiable_backward(ctx, (x1, x2, *values), grad_out))
        params = dict(zip(ctx.names, values))
        need_x1, need_x2, *need_p = ctx.needs_input_grad[2:]
        wanted_p = tuple(n for n, w in zip(ctx.names, need_p) if w)
        batch = _batch(x1, x2, grad_out, *values)
        gx1 = gx2 = None
        grads: dict[str, Tensor] = {}
        if ctx.same_inputs and need_x1:
            # K(x, x): the gradients reaching x through both sides in one pass over rows, weighted
            # by G and G^T (half the work of a pass over rows of x1 plus one over rows of x2).
            want = ("x",) + wanted_p
            pairs = [grad_out, grad_out.transpose(-1, -2).contiguous()]
            gx1, _, grads = _grad_pass(ctx.formula, "sym-pair", x1, x1, params, want, batch, {"pairs": pairs})
            return (None, None, _input_grad(gx1, x1, batch), None, *_param_grads(params, grads, batch))
        a_runs = need_x1 or (wanted_p and not need_x2)
        if a_runs:
            want = (("x",) if need_x1 else ()) + wanted_p
            gx1, _, grads = _grad_pass(ctx.formula, "gradA-pair", x1, x2, params, want, batch, {"pairs": [grad_out]})
        if need_x2:
            want = ("x",) + (() if a_runs else wanted_p)
            gx2, _, more = _grad_pass(
                ctx.formula, "gradB-pair", x1, x2, params, want, batch, {"pairs": [grad_out.transpose(-1, -2)]}
            )
            grads.update(more)
        return (None, None, _input_grad(gx1, x1, batch), _input_grad(gx2, x2, batch), *_param_grads(params, grads, batch))


# ---------------------------------------------------------------------------- public API
def supports(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool:
    """Whether the CPU engine evaluates ``formula`` on these tensors (else use KeOps or torch).

    True when: the tensors are on the CPU, all float32 or all float64, with broadcastable batch
    shapes; the platform is Linux on x86-64 with a C++ compiler; and the formula traces into
    operations the engine generates (see ``lazykern.cpu.trace``) with one value per pair.
    Nothing is compiled.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(10, 3, dtype=torch.float64)
        >>> supports(StationaryFormula("rbf"), x, x, {})
        True
    """
    tensors = [x1, x2, *params.values()]
    if not all(isinstance(t, Tensor) and t.device.type == "cpu" and t.dtype == x1.dtype for t in tensors):
        return False
    if x1.dtype not in _DTYPES or x1.dim() < 2 or x2.dim() < 2 or any(p.dim() < 2 for p in params.values()):
        return False
    if not _platform_ok():
        return False
    try:
        _batch(*tensors)
        _program(formula, "mm", x1.shape[-1], x2.shape[-1], _spec(params), _DTYPES[x1.dtype])
    except (Unsupported, RuntimeError):
        return False
    return True


@functools.lru_cache(maxsize=1)
def _platform_ok() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64") and build.compiler() is not None


def _check(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> None:
    if not supports(formula, x1, x2, params):
        try:  # name what the formula does that the engine lacks, when that is the reason
            _build_program(formula, "mm", x1.shape[-1], x2.shape[-1], _spec(params), _DTYPES.get(x1.dtype, "double"), ())
        except Unsupported as err:
            raise ValueError(f"lazykern's CPU engine cannot evaluate this formula: {err}") from err
        raise ValueError(
            "lazykern's CPU engine needs CPU tensors of one dtype (float32 or float64) with broadcastable "
            f"batch shapes on Linux x86-64 with g++; got x1 {x1.dtype} on {x1.device}, x2 {x2.dtype} on "
            f"{x2.device}, params {[(n, p.dtype, tuple(p.shape)) for n, p in params.items()]}"
        )


def matmul(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor) -> Tensor:
    r""":math:`K(x_1, x_2)\, V` without storing :math:`K`, differentiable in ``x1``, ``x2``, ``rhs``
    and every parameter.

    .. math::

        (K V)_{ic} = \sum_j k(x^{(1)}_i, x^{(2)}_j)\, V_{jc}

    Args:
        formula: a kernel formula (:mod:`lazykern.formulas`) with one value per pair.
        x1: ``(..., N, D1)`` inputs (rows of the result).
        x2: ``(..., M, D2)`` inputs.
        params: tensor parameters, each ``(..., 1, K)``.
        rhs: ``(..., M, C)`` (or ``(M,)``, giving ``(N,)``).

    Raises ``ValueError`` when :func:`supports` is false.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(100, 3, dtype=torch.float64)
        >>> matmul(StationaryFormula("rbf"), x, x, {}, torch.ones(100, 2, dtype=torch.float64)).shape
        torch.Size([100, 2])
    """
    _check(formula, x1, x2, params)
    vector = rhs.dim() == 1
    if vector:
        rhs = rhs.unsqueeze(-1)
    if rhs.dtype != x1.dtype or rhs.device.type != "cpu":
        raise ValueError(f"rhs must be a CPU tensor of dtype {x1.dtype}, got {rhs.dtype} on {rhs.device}")
    if rhs.shape[-2] != x2.shape[-2]:
        raise ValueError(f"rhs must have {x2.shape[-2]} rows (the points of x2), got shape {tuple(rhs.shape)}")
    names = tuple(params)
    out = _Matmul.apply(formula, names, x1, x2, rhs, *params.values())
    return out.squeeze(-1) if vector else out


def dense(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    r"""The ``(..., N, M)`` matrix :math:`K_{ij} = k(x^{(1)}_i, x^{(2)}_j)`, computed row by row in
    one pass (nothing ``N x M x D``), differentiable in ``x1``, ``x2`` and every parameter.

    Args:
        formula: a kernel formula with one value per pair.
        x1: ``(..., N, D1)``.
        x2: ``(..., M, D2)``.
        params: tensor parameters, each ``(..., 1, K)``.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(50, 3, dtype=torch.float64)
        >>> K = dense(StationaryFormula("rbf"), x, x, {})
        >>> torch.allclose(K.diagonal(), torch.ones(50, dtype=torch.float64))
        True
    """
    _check(formula, x1, x2, params)
    return _Dense.apply(formula, tuple(params), x1, x2, *params.values())


def symmetric_gradients(
    formula: Formula, x: Tensor, params: Mapping[str, Tensor], left: Tensor, right: Tensor
) -> tuple[Tensor | None, dict[str, Tensor | None]]:
    r"""Gradients of :math:`S = \sum_{ij} \langle l_i, r_j\rangle\, k(x_i, x_j)` with respect to
    ``x`` (both occurrences) and each parameter, in ONE pass over the pairs.

    .. math::

        \frac{\partial S}{\partial x_i} = \sum_j \langle l_i, r_j\rangle \partial_1 k(x_i, x_j)
        + \langle l_j, r_i\rangle \partial_2 k(x_j, x_i),

    where for a symmetric formula (``formula.symmetric``: :math:`k(u, v) = k(v, u)`) the second
    derivative is the first, so :math:`k` is evaluated once per pair. Same contract as
    :func:`lazykern.backend.symmetric_gradients`: the gradient for ``x`` is ``None`` unless ``x``
    requires grad, and so is each parameter's.

    Args:
        formula: a kernel formula with one value per pair.
        x: ``(..., N, D)``.
        params: tensor parameters, each ``(..., 1, K)``.
        left: ``(..., N, C)``, the :math:`l_i`.
        right: ``(..., N, C)``, the :math:`r_j`.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(20, 3, dtype=torch.float64, requires_grad=True)
        >>> v = torch.randn(20, 1, dtype=torch.float64)
        >>> gx, _ = symmetric_gradients(StationaryFormula("rbf"), x, {}, v, v)
        >>> gx.shape
        torch.Size([20, 3])
    """
    _check(formula, x, x, params)
    want = (("x",) if x.requires_grad else ()) + tuple(n for n, p in params.items() if p.requires_grad)
    if not want:
        return None, {n: None for n in params}
    left, right = left.detach(), right.detach()
    batch = _batch(x, left, right, *params.values())
    gx, _, grads = _grad_pass(formula, "sym", x, x, params, want, batch, {"dots": [(left, right), (right, left)]})
    values = _param_grads(params, grads, batch)
    return _input_grad(gx, x, batch), dict(zip(params, values))
