r"""The structured engine as the chooser lists it: first-order additive Matérn and RBF formulas.

It takes, on CPU tensors, every formula that is a weighted sum of one-dimensional half-integer
Matérn or Gaussian terms, one per input dimension, alone or
:class:`~lazykern.formulas.composite.Scaled` by an ``outputscale``:

* :class:`~lazykern.formulas.stationary.StationaryFormula` s with ``additive=True`` of the
  ``"matern"`` (any half-integer nu) and ``"rbf"`` families, whose only tensor parameter is the
  per-dimension ``scales`` (the inputs arrive divided by the lengthscales) — what
  ``AdditiveStructureKernel(MaternKernel(...))`` and ``AdditiveStructureKernel(RBFKernel())``
  build, with or without component scales, inside ``ScaleKernel`` or not (and a projected
  additive kernel of such terms);
* :class:`~lazykern.formulas.interactions.InteractionFormula` s of ``max_degree=1`` of such terms:
  a first-order ``NewtonGirardAdditiveKernel``, :math:`\frac{\sigma_1^2}{D} \sum_d s_d k_d` (the first
  normalized elementary symmetric polynomial).

A first-order ``OrthogonalAdditiveKernel`` is not taken, although each of its terms is a Gaussian
term less a rank-one correction, :math:`e^{-(u - u')^2/2} - a(u)\, a(u')`: the difference is of the
size of the term's variance, which OAK divides by, while the fast Gauss transform's error is
bounded relative to :math:`\sum_j |v_j|`, so its relative error grows as the variance shrinks
(measured against the pair engine: docs/structured.rst).

The output and order scales are folded into the per-dimension scales in torch, so their gradients
are autograd's. Everything else stays on the other engines.

Products cost :math:`O((N + M)\, d\, C)` after one sort per dimension
(:mod:`lazykern.structured.additive`); the Gaussian's are within
:class:`lazykern.settings.structured_tolerance` of the exact sums. Batch dimensions are looped
over. First derivatives are structured passes; a backward pass that must itself be differentiable
(``create_graph=True``) takes the shared row blocks (:func:`lazykern.row_blocks.vjp`), exact and
differentiable to any order.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping

import torch
from torch import Tensor

from .. import row_blocks, settings
from ..engine import Engine, Gradients, Preconditioner
from ..formulas import Formula, StationaryFormula
from .additive import gradients, product
from .forms import AdditiveForm, additive_form, plan
from .grid import AdditiveGrid, additive_terms

__all__ = ["ENGINE", "AdditiveForm", "StructuredEngine", "additive_form"]


def _parameter(formula: StationaryFormula, dtype: torch.dtype) -> float:
    """Matérn's nu, or the Gaussian's error bound for this dtype."""
    if formula.nu is not None:  # the Matérn family's, and only its
        return formula.nu
    return settings.structured_tolerance.for_dtype(dtype)


def _product(form: AdditiveForm, x1: Tensor, x2: Tensor, rhs: Tensor) -> Tensor:
    """``K(x1, x2) @ rhs`` of an additive form, differentiable (``x1 is x2`` for one set)."""
    return _Matmul.apply(form.terms, x1, x2, form.scales, rhs)


def _batched(x1: Tensor, x2: Tensor, scales: Tensor, rhs: Tensor) -> tuple[torch.Size, list[tuple]]:
    """The broadcast batch shape and, per batch element, its ``(x1, x2, scales, rhs)``; ``x1 is x2``
    in every element when it is so in the arguments."""
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2], scales.shape[:-2], rhs.shape[:-2])
    one_set = x1 is x2

    def flat(t: Tensor) -> Tensor:
        return t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])

    f1, fs, fr = flat(x1), flat(scales), flat(rhs)
    f2 = f1 if one_set else flat(x2)
    elements = []
    for b in range(f1.shape[0]):
        e1 = f1[b]  # one view for both sides: the sums walk the one set
        elements.append((e1, e1 if one_set else f2[b], fs[b].reshape(-1), fr[b]))
    return batch, elements


class _Matmul(torch.autograd.Function):
    """Sums only: nothing per dimension is kept for the backward pass, which walks again (walks
    cost O(N) each, keeping them would cost O(N d C) of memory)."""

    @staticmethod
    def forward(ctx, formula, x1, x2, scales, rhs):  # noqa: D102 - autograd protocol
        family, parameter = formula.family, _parameter(formula, rhs.dtype)
        batch, elements = _batched(x1, x2, scales, rhs)
        outs = [product(family, parameter, e1, e2, er, es) for e1, e2, es, er in elements]
        ctx.formula, ctx.one_set = formula, x1 is x2
        ctx.save_for_backward(x1, x2, scales, rhs)
        stacked = outs[0].unsqueeze(0) if len(outs) == 1 else torch.stack(outs)  # no copy of a lone element
        return stacked.reshape(*batch, *outs[0].shape).to(rhs.dtype)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd protocol
        x1, x2, scales, rhs = ctx.saved_tensors
        wanted = ctx.needs_input_grad[1:]
        if torch.is_grad_enabled():  # create_graph=True: the row blocks, differentiable again
            inputs = (x1, x2, scales, rhs)
            return (None, *row_blocks.vjp(ctx.formula, ("scales",), inputs, wanted, grad_out))
        family, parameter = ctx.formula.family, _parameter(ctx.formula, rhs.dtype)
        if ctx.one_set:
            x2 = x1  # one tensor (autograd's saved copies are distinct objects)
        batch, elements = _batched(x1, x2, scales, rhs)
        grads = grad_out.expand(*batch, *grad_out.shape[-2:]).reshape(-1, *grad_out.shape[-2:])
        order = (wanted[0], wanted[1], wanted[3], wanted[2])  # gradients() takes x1, x2, v, scales
        parts = [gradients(family, parameter, e1, e2, er, es, grads[i], order)
                 for i, (e1, e2, es, er) in enumerate(elements)]
        results = []
        for slot, (like, want) in enumerate(((x1, wanted[0]), (x2, wanted[1]), (rhs, wanted[3]), (scales, wanted[2]))):
            if not want or (ctx.one_set and slot == 1):
                results.append(None)
                continue
            # One element (no batch): its gradient as it is; stacking would copy N x d float64.
            stacked = parts[0][slot].unsqueeze(0) if len(parts) == 1 else torch.stack([p[slot] for p in parts])
            shape = (*batch, *like.shape[-2:]) if slot < 3 else (*batch, 1, like.shape[-1])
            results.append(stacked.reshape(shape).sum_to_size(like.shape).to(like.dtype))
        gx1, gx2, grhs, gscales = results
        return None, gx1, gx2, gscales, grhs


class StructuredEngine(Engine):
    """First-order additive kernels of one-dimensional Matérn or Gaussian terms in O((N + M) d). Its
    plan of a formula is the formula's additive form (:func:`lazykern.structured.forms.plan`), and
    its preconditioner of solves with them interpolates each term from a grid
    (:class:`lazykern.structured.grid.AdditiveGrid`).

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(300, 4, dtype=torch.float64)
        >>> f, s = StationaryFormula("matern", additive=True, nu=2.5), {"scales": torch.ones(1, 4, dtype=torch.float64)}
        >>> plan = ENGINE.supports(f, x, x, s)
        >>> type(plan).__name__, ENGINE.supports(StationaryFormula("rbf"), x, x, {})
        ('AdditiveForm', None)
        >>> ENGINE.matmul(f, x, x, s, torch.ones(300, 2, dtype=torch.float64), plan).shape
        torch.Size([300, 2])
    """

    name = "structured"
    products_beat_dense = True

    def supports(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> AdditiveForm | None:
        return plan(formula, x1, x2, params)

    def unsupported(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str:
        return ("the structured engine evaluates first-order additive Matérn and RBF kernels "
                "(StationaryFormula(additive=True) with parameters {'scales'}, or InteractionFormula(max_degree=1) "
                f"of such terms, optionally Scaled) on CPU tensors; got {formula!r} "
                f"with parameters {sorted(params)} on {x1.device}")

    def matmul(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor,
               plan: AdditiveForm | None = None) -> Tensor:
        return _product(self.planned(plan, formula, x1, x2, params), x1, x2, rhs)

    def fuses_symmetric_gradient(self, formula: Formula) -> bool:
        return True

    def symmetric_gradients(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
                            left: Tensor, right: Tensor, plan: AdditiveForm | None = None) -> Gradients | None:
        # The gradients of <L, K R> by this engine's own backward: one walk with the values [R, L].
        if x1 is not x2 and (x1.requires_grad or x2.requires_grad):
            return None
        self.planned(plan, formula, x1, x2, params)
        with torch.enable_grad():
            x = x1.detach().requires_grad_(x1.requires_grad)
            leaves = {name: p.detach().requires_grad_(p.requires_grad) for name, p in params.items()}
            wanted = [t for t in (x, *leaves.values()) if t.requires_grad]
            if not wanted:
                return None, None, {name: None for name in params}
            # the form again, of the leaves: the plan's scales are of the parameters themselves
            form = additive_form(formula, leaves)
            assert form is not None  # planned above
            out = _product(form, x, x, right.detach())
            grads = iter(torch.autograd.grad(out, wanted, left.detach()))
        grad_x = next(grads) if x.requires_grad else None
        return grad_x, None, {name: next(grads) if p.requires_grad else None for name, p in leaves.items()}

    def preconditioner(self, formula: Formula, x: Tensor,
                       params: Mapping[str, Tensor]) -> Callable[..., Preconditioner] | None:
        """The grid preconditioner (:class:`~lazykern.structured.grid.AdditiveGrid`) of the terms
        :func:`~lazykern.structured.grid.additive_terms` finds, for one set of points without batch
        dimensions: ``build(noise, max_rank=..., extent=...)``."""
        terms = additive_terms(formula, x, params)
        if terms is None:
            return None
        one_dimensional, scales = terms
        return functools.partial(AdditiveGrid, one_dimensional, x, scales.reshape(-1))


#: The structured engine, as the chooser (:mod:`lazykern.backend`) lists it.
ENGINE = StructuredEngine()
