r"""The driver of compiled reductions: the passes of a product, a dense block and a fused gradient, on any target.

The forward and backward passes of :math:`Y = K V` (:math:`\bar Y` the incoming gradient):

* forward, over rows of ``x1``: :math:`Y_i = \sum_j k(x_i, z_j) V_j`;
* backward, over rows of ``x1`` (job ``"gradA"``): :math:`\sum_j \langle \bar Y_i, V_j\rangle\,
  \partial k/\partial x_i` and the per-row parts of :math:`\partial/\partial\theta` (summed over rows
  afterwards);
* backward, over rows of ``x2`` (job ``"gradB"``, only when ``x2`` or ``V`` needs a gradient):
  :math:`\sum_i \langle \bar Y_i, V_j\rangle\, \partial k/\partial z_j` and
  :math:`\bar V_j = \sum_i k(x_i, z_j) \bar Y_i`, in the same pass.

A dense block :math:`K` has the same two backward passes with the weights read from the incoming
gradient matrix :math:`G` (``"gradA-pair"``, ``"gradB-pair"``); :math:`K(x, x)` of one tensor takes
one pass weighted by :math:`G` and :math:`G^\top` (``"sym-pair"``). Each pass is planned by
``lazykern.compiler.plan.program``; which passes run, and how their outputs become the
gradients autograd expects, is decided here, once for every target.

A *target* (:class:`Target`) is the device side of a compiled engine (``lazykern.cpu.reductions.TARGET``,
``lazykern.triton.reductions.TARGET``), handed to the driver explicitly; the buffers every pass
reads and writes are set up here, in the row-major layouts of ``row_buffer``, except the inner
side, which each target lays out its own way. Its hooks are :class:`Target`'s methods:
``inner_buffer`` and ``inner_vectors`` (the inner side's layout) and ``launch`` (run one pass);
``available``, ``accepts`` and ``unsupported`` say where it runs. :class:`CompiledEngine` is a
target as an engine (:class:`lazykern.engine.Engine`), whose plan of a formula is its product pass
(:func:`lazykern.compiler.plan.product_plan`): the C and Triton engines are instances of it.

Second derivatives (``create_graph=True``) come from the row blocks every engine shares
(:func:`lazykern.row_blocks.vjp`) on every target: the derivative of a gradient pass is another
reduction with other weights.

Example:
    >>> import torch
    >>> from lazykern.cpu.reductions import TARGET
    >>> from lazykern.formulas import StationaryFormula
    >>> x = torch.randn(30, 2, dtype=torch.float64, requires_grad=True)
    >>> v = torch.randn(30, 1, dtype=torch.float64)
    >>> matmul(TARGET, StationaryFormula("rbf"), x, x, {}, v).sum().backward()
    >>> x.grad.shape
    torch.Size([30, 2])
"""

from __future__ import annotations

import functools
from typing import Mapping

import torch
from torch import Tensor

from .. import row_blocks
from ..engine import Engine, Gradients
from ..formulas import Formula
from .plan import DTYPES, Reduction, param_spec, product_plan, program

__all__ = ["CompiledEngine", "Target", "dense", "matmul", "symmetric_gradients"]

Buffer = tuple[Tensor, int]  # a pass's operand: base tensor and batch stride


class Target:
    """The device side of a compiled engine: what it evaluates, its inner-side layout, its launches.

    Attributes:
        title: the engine as error messages name it (``"lazykern's CPU engine"``).
    """

    title: str = ""

    def available(self) -> bool:
        """Whether the target runs in this process at all (its library installed, its device present)."""
        return True

    def accepts(self, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool:
        """Whether the target runs on these tensors (devices, platform; the formula and dtypes are
        the plan's business: :func:`lazykern.compiler.plan.product_plan`)."""
        raise NotImplementedError

    def unsupported(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str:
        """Why the target does not evaluate ``formula`` on these tensors, one sentence for a ``ValueError``."""
        raise NotImplementedError

    def inner_buffer(self, t: Tensor, batch: torch.Size, nb: int) -> Buffer:
        """The buffer and batch stride of the inner points ``(..., M, W)``."""
        raise NotImplementedError

    def inner_vectors(self, t: Tensor, batch: torch.Size, nb: int) -> Buffer:
        """The buffer and batch stride of a column array over the inner points ``(..., M, C)``."""
        raise NotImplementedError

    def launch(self, red: Reduction, buffers: dict[str, Buffer], nb: int, n: int, m: int, c: int) -> None:
        """Run the pass ``red`` over ``nb`` batches of ``n`` x ``m`` pairs and ``c`` columns, on
        buffers named by :meth:`~lazykern.compiler.plan.Reduction.operands`."""
        raise NotImplementedError


def batch_shape(*tensors: Tensor) -> torch.Size:
    """The broadcast batch shape of ``(..., rows, width)`` tensors."""
    return torch.broadcast_shapes(*(t.shape[:-2] for t in tensors))


# ---------------------------------------------------------------------------- buffers
# Every target binds a pass's operands as (base tensor, batch stride) pairs, by role.
def flat_buffer(t: Tensor, batch: torch.Size, nb: int) -> tuple[Tensor, int, int]:
    """``t`` broadcast to ``batch`` as ``(nb, rows, width)``: the base tensor and its batch stride
    (0 where ``t`` is shared by every batch entry, so it is never copied)."""
    t = t.expand(*batch, *t.shape[-2:]).reshape(nb, *t.shape[-2:])
    if nb == 1 or t.stride(0) == 0:
        return t[0].contiguous(), 0, 1
    t = t.contiguous()
    return t, t[0].numel(), nb


def row_buffer(t: Tensor, batch: torch.Size, nb: int) -> tuple[Tensor, int]:
    base, stride, _ = flat_buffer(t, batch, nb)
    return base, stride


def param_buffers(params: Mapping[str, Tensor], batch: torch.Size, nb: int) -> dict[str, tuple[Tensor, int]]:
    return {f"param:p:{n}": row_buffer(p.detach(), batch, nb) for n, p in params.items()}


def output_buffer(batch: torch.Size, n: int, w: int, like: Tensor) -> tuple[Tensor, int]:
    """A ``(*batch, n, w)`` result and its batch stride, allocated in its final shape: a view
    returned by an autograd Function may not be modified in place."""
    return like.new_empty(*batch, n, w), n * w


def named_grads(
    sums: tuple[Tensor, int] | None, want: tuple[str, ...], outer: Tensor, params: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The ``(rows, total width)`` sums of a backward pass split into its gradients by name (``"x"``
    for the outer input, then the parameters, in the pass's output order)."""
    if sums is None:
        return {}
    names = [w for w in ("x", *params) if w in want]
    widths = [outer.shape[-1] if w == "x" else params[w].shape[-1] for w in names]
    return dict(zip(names, sums[0].split(widths, dim=-1)))


# ---------------------------------------------------------------------------- the passes
def _forward_matmul(target: Target, red: Reduction, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
                    rhs: Tensor) -> Tensor:
    """``K @ rhs``, ``(*batch, N, C)``, by the product pass ``red``."""
    batch = batch_shape(x1, x2, rhs, *params.values())
    nb = batch.numel()
    n, m, c = x1.shape[-2], x2.shape[-2], rhs.shape[-1]
    out = output_buffer(batch, n, c, x1)
    buffers = {
        "outer:o": row_buffer(x1.detach(), batch, nb),
        "inner:i": target.inner_buffer(x2.detach(), batch, nb),
        "ivec:0": target.inner_vectors(rhs.detach(), batch, nb),
        "out:matmul": out,
        **param_buffers(params, batch, nb),
    }
    target.launch(red, buffers, nb, n, m, c)
    return out[0]


def _forward_dense(target: Target, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """The dense ``(*batch, N, M)`` block."""
    batch = batch_shape(x1, x2, *params.values())
    nb = batch.numel()
    n, m = x1.shape[-2], x2.shape[-2]
    red = program(formula, "dense", x1.shape[-1], x2.shape[-1], param_spec(params), DTYPES[x1.dtype])
    out = output_buffer(batch, n, m, x1)
    buffers = {
        "outer:o": row_buffer(x1.detach(), batch, nb),
        "inner:i": target.inner_buffer(x2.detach(), batch, nb),
        "out:store": out,
        **param_buffers(params, batch, nb),
    }
    target.launch(red, buffers, nb, n, m, 1)
    return out[0]


def _grad_pass(target: Target, formula: Formula, job: str, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
               want: tuple[str, ...], batch: torch.Size,
               vecs: dict[str, list]) -> tuple[Tensor | None, Tensor | None, dict[str, Tensor]]:
    r"""One backward pass: the gradient of its outer input, the product :math:`K^\top \bar Y` (or
    ``None``) and the per-row parameter gradients by name, each ``(*batch, rows, width)``; ``vecs``
    holds ``"dots"`` (pairs of column arrays whose dot products weight the pairs) or ``"pairs"``
    (dense weight matrices)."""
    nb = batch.numel()
    outer, inner = (x2, x1) if job.startswith("gradB") else (x1, x2)
    n, m = outer.shape[-2], inner.shape[-2]
    red = program(formula, job, x1.shape[-1], x2.shape[-1], param_spec(params), DTYPES[x1.dtype], want)
    buffers = {
        "outer:o": row_buffer(outer.detach(), batch, nb),
        "inner:i": target.inner_buffer(inner.detach(), batch, nb),
        **param_buffers(params, batch, nb),
    }
    c = 1
    for k, weight in enumerate(vecs.get("pairs", ())):
        buffers[f"pair:w{k}"] = row_buffer(weight, batch, nb)
    for k, (ov, iv) in enumerate(vecs.get("dots", ())):
        buffers[f"ovec:{k}"], buffers[f"ivec:{k}"] = row_buffer(ov, batch, nb), target.inner_vectors(iv, batch, nb)
        c = ov.shape[-1]
    sums = output_buffer(batch, n, red.sums_width, x1) if red.sums else None
    product = output_buffer(batch, n, c, x1) if red.matmul is not None else None
    buffers.update({name: b for name, b in (("out:sums", sums), ("out:matmul", product)) if b is not None})
    target.launch(red, buffers, nb, n, m, c)
    grads = named_grads(sums, want, outer, params)
    return grads.pop("x", None), (None if product is None else product[0]), grads


def _param_grads(params: Mapping[str, Tensor], grads: dict[str, Tensor], batch: torch.Size) -> list[Tensor | None]:
    out = []
    for name, p in params.items():
        g = grads.get(name)
        out.append(None if g is None else g.sum(-2).reshape(*batch, 1, p.shape[-1]).sum_to_size(p.shape))
    return out


def _input_grad(g: Tensor | None, t: Tensor, batch: torch.Size) -> Tensor | None:
    return None if g is None else g.reshape(*batch, *t.shape[-2:]).sum_to_size(t.shape)


def _differentiable_backward(ctx, inputs: tuple[Tensor, ...], grad_out: Tensor, skip: int = 3) -> list[Tensor | None]:
    """The gradients of a backward pass that must itself be differentiable (``create_graph=True``:
    Hessians, Hessian-vector products), for ``inputs`` ``(x1, x2, *parameters[, rhs])``, the
    autograd function's tensors after its ``skip`` other arguments.

    The compiled passes give first derivatives only; the derivative of a gradient pass is another
    reduction with other weights, so these come from the torch engine's row blocks, differentiable
    to any order (:func:`lazykern.row_blocks.vjp`): exact, and one block in memory at a time."""
    needs = ctx.needs_input_grad[skip:]
    if len(inputs) > 2 + len(ctx.names):  # a product: autograd's order is x1, x2, rhs, *parameters
        needs = (needs[0], needs[1], *needs[3:], needs[2])
    return row_blocks.vjp(ctx.formula, ctx.names, inputs, needs, grad_out)


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, target, formula, red, names, x1, x2, rhs, *values):  # noqa: D102 - autograd protocol
        params = dict(zip(names, values))
        ctx.target, ctx.formula, ctx.names = target, formula, names
        ctx.save_for_backward(x1, x2, rhs, *values)
        return _forward_matmul(target, red, x1, x2, params, rhs)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd protocol
        x1, x2, rhs, *values = ctx.saved_tensors
        need_x1, need_x2, need_rhs, *need_p = ctx.needs_input_grad[4:]
        if torch.is_grad_enabled():  # create_graph=True: see _differentiable_backward
            gx1, gx2, *gp, grhs = _differentiable_backward(ctx, (x1, x2, *values, rhs), grad_out, 4)
            return (None, None, None, None, gx1, gx2, grhs, *gp)
        grad_pass = functools.partial(_grad_pass, ctx.target)
        params = dict(zip(ctx.names, values))
        wanted_p = tuple(n for n, w in zip(ctx.names, need_p) if w)
        batch = batch_shape(x1, x2, rhs, grad_out, *values)
        grad_out = grad_out.contiguous()
        gx1 = gx2 = grhs = None
        grads: dict[str, Tensor] = {}
        a_runs = need_x1 or (wanted_p and not (need_x2 or need_rhs))
        if a_runs:
            want = (("x",) if need_x1 else ()) + wanted_p
            gx1, _, grads = grad_pass(ctx.formula, "gradA", x1, x2, params, want, batch, {"dots": [(grad_out, rhs.detach())]})
        if need_x2 or need_rhs:
            want = (("x",) if need_x2 else ()) + (() if a_runs else wanted_p) + (("rhs",) if need_rhs else ())
            gx2, grhs, more = grad_pass(ctx.formula, "gradB", x1, x2, params, want, batch, {"dots": [(rhs.detach(), grad_out)]})
            grads.update(more)
        return (
            None,
            None,
            None,
            None,
            _input_grad(gx1, x1, batch),
            _input_grad(gx2, x2, batch),
            _input_grad(grhs, rhs, batch),
            *_param_grads(params, grads, batch),
        )


class _Dense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, target, formula, names, x1, x2, *values):  # noqa: D102 - autograd protocol
        ctx.target, ctx.formula, ctx.names, ctx.same_inputs = target, formula, names, x1 is x2
        ctx.save_for_backward(x1, x2, *values)
        return _forward_dense(target, formula, x1, x2, dict(zip(names, values)))

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd protocol
        x1, x2, *values = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: see _differentiable_backward
            return (None, None, None, *_differentiable_backward(ctx, (x1, x2, *values), grad_out))
        grad_pass = functools.partial(_grad_pass, ctx.target)
        params = dict(zip(ctx.names, values))
        need_x1, need_x2, *need_p = ctx.needs_input_grad[3:]
        wanted_p = tuple(n for n, w in zip(ctx.names, need_p) if w)
        batch = batch_shape(x1, x2, grad_out, *values)
        gx1 = gx2 = None
        grads: dict[str, Tensor] = {}
        if ctx.same_inputs and need_x1:
            # K(x, x): the gradients reaching x through both sides in one pass over rows, weighted
            # by G and G^T (half the work of a pass over rows of x1 plus one over rows of x2).
            want = ("x",) + wanted_p
            pairs = [grad_out, grad_out.transpose(-1, -2).contiguous()]
            gx1, _, grads = grad_pass(ctx.formula, "sym-pair", x1, x1, params, want, batch, {"pairs": pairs})
            return (None, None, None, _input_grad(gx1, x1, batch), None, *_param_grads(params, grads, batch))
        a_runs = need_x1 or (wanted_p and not need_x2)
        if a_runs:
            want = (("x",) if need_x1 else ()) + wanted_p
            gx1, _, grads = grad_pass(ctx.formula, "gradA-pair", x1, x2, params, want, batch, {"pairs": [grad_out]})
        if need_x2:
            want = ("x",) + (() if a_runs else wanted_p)
            gx2, _, more = grad_pass(
                ctx.formula, "gradB-pair", x1, x2, params, want, batch, {"pairs": [grad_out.transpose(-1, -2)]}
            )
            grads.update(more)
        return (
            None, None, None,
            _input_grad(gx1, x1, batch), _input_grad(gx2, x2, batch), *_param_grads(params, grads, batch),
        )


def matmul(
    target: Target, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor,
    red: Reduction | None = None,
) -> Tensor:
    r""":math:`(K V)_{ic} = \sum_j k(x^{(1)}_i, x^{(2)}_j)\, V_{jc}` on ``target`` without storing
    :math:`K`, differentiable in ``x1``, ``x2``, ``rhs`` and every parameter (``rhs`` ``(..., M, C)``
    or ``(M,)``); ``red``: the product pass where the caller planned it already
    (:func:`lazykern.compiler.plan.product_plan`)."""
    vector = rhs.dim() == 1
    if vector:
        rhs = rhs.unsqueeze(-1)
    _check_like("rhs", rhs, x1)
    if rhs.shape[-2] != x2.shape[-2]:
        raise ValueError(f"rhs must have {x2.shape[-2]} rows (the points of x2), got shape {tuple(rhs.shape)}")
    red = red or program(formula, "mm", x1.shape[-1], x2.shape[-1], param_spec(params), DTYPES[x1.dtype])
    out = _Matmul.apply(target, formula, red, tuple(params), x1, x2, rhs, *params.values())
    return out.squeeze(-1) if vector else out


def _check_like(name: str, t: Tensor, x: Tensor) -> None:
    """Vectors the targets read as raw buffers of ``x``'s type on ``x``'s device (a float32 vector read as
    doubles is garbage; a host pointer on a GPU, a fault)."""
    if t.dtype != x.dtype or t.device != x.device:
        raise ValueError(f"{name} must be a tensor of dtype {x.dtype} on {x.device}, got {t.dtype} on {t.device}")


def dense(target: Target, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    r"""The ``(..., N, M)`` matrix :math:`K_{ij} = k(x^{(1)}_i, x^{(2)}_j)` on ``target`` in one pass
    that stores each row (nothing ``N x M x D``; entries below the normal range stored as zeros),
    differentiable in ``x1``, ``x2`` and every parameter (:math:`K(x, x)` of one tensor: one
    backward pass for both sides)."""
    return _Dense.apply(target, formula, tuple(params), x1, x2, *params.values())


def symmetric_gradients(
    target: Target, formula: Formula, x: Tensor, params: Mapping[str, Tensor], left: Tensor, right: Tensor
) -> tuple[Tensor | None, dict[str, Tensor | None]]:
    r"""The gradients of :math:`S = \sum_{ij} \langle l_i, r_j\rangle\, k(x_i, x_j)` for ``x`` (both
    occurrences) and each parameter requiring grad, in one pass (job ``"sym"``) on ``target``:

    .. math::

        \frac{\partial S}{\partial x_i} = \sum_j \langle l_i, r_j\rangle \partial_1 k(x_i, x_j)
        + \langle l_j, r_i\rangle \partial_2 k(x_j, x_i),

    where for a symmetric formula (``formula.symmetric``: :math:`k(u, v) = k(v, u)`) the second
    derivative is the first, so :math:`k` is evaluated once per pair. ``left``, ``right``:
    ``(..., N, C)``, the :math:`l_i` and :math:`r_j`; the gradient of ``x`` is ``None`` unless it
    requires grad, and so is each parameter's."""
    _check_like("left", left, x)
    _check_like("right", right, x)
    want = (("x",) if x.requires_grad else ()) + tuple(n for n, p in params.items() if p.requires_grad)
    if not want:
        return None, {n: None for n in params}
    left, right = left.detach(), right.detach()
    batch = batch_shape(x, left, right, *params.values())
    vecs = {"dots": [(left, right), (right, left)]}
    gx, _, grads = _grad_pass(target, formula, "sym", x, x, params, want, batch, vecs)
    values = _param_grads(params, grads, batch)
    return _input_grad(gx, x, batch), dict(zip(params, values))


class CompiledEngine(Engine):
    """A compiled target as an engine (:class:`lazykern.engine.Engine`): products, dense blocks and
    the fused symmetric gradient of any formula the target supports, through this driver. Its plan
    of a formula is the product pass (:func:`lazykern.compiler.plan.product_plan`), which a product
    runs as it is.

    Args:
        name: the engine's name in :class:`lazykern.settings.engine`.
        target: its device side.

    Example:
        >>> import torch
        >>> from lazykern.cpu.engine import ENGINE
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(100, 3, dtype=torch.float64)
        >>> plan = ENGINE.supports(StationaryFormula("rbf"), x, x, {})
        >>> ENGINE.matmul(StationaryFormula("rbf"), x, x, {}, torch.ones(100, 2, dtype=torch.float64), plan).shape
        torch.Size([100, 2])
    """

    def __init__(self, name: str, target: Target) -> None:
        self.name, self.target = name, target

    def supports(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Reduction | None:
        if not (self.target.available() and self.target.accepts(x1, x2, params)):
            return None
        return product_plan(formula, x1, x2, params)

    def unsupported(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str:
        return self.target.unsupported(formula, x1, x2, params)

    def available(self) -> bool:
        return self.target.available()

    def matmul(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor,
               plan: Reduction | None = None) -> Tensor:
        red = self.planned(plan, formula, x1, x2, params)
        return matmul(self.target, formula, x1, x2, params, rhs, red)

    def dense(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
              plan: Reduction | None = None) -> Tensor:
        self.planned(plan, formula, x1, x2, params)
        return dense(self.target, formula, x1, x2, params)  # subnormals flushed in the compiled pass

    def fuses_symmetric_gradient(self, formula: Formula) -> bool:
        return True  # any formula the target takes

    def symmetric_gradients(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
                            left: Tensor, right: Tensor, plan: Reduction | None = None) -> Gradients | None:
        # The compiled pass sums both occurrences of x: distinct tensors asking for their own
        # shares take the generic path.
        if x1 is not x2 and (x1.requires_grad or x2.requires_grad):
            return None
        self.planned(plan, formula, x1, x2, params)
        grad, grads = symmetric_gradients(self.target, formula, x1, params, left, right)
        return grad, None, grads
