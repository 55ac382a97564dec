r"""The KeOps engine: a formula's products and fused symmetric gradients as KeOps reductions.

The inputs are wrapped as ``LazyTensor`` (:func:`lazykern.keops.keops_lazy_tensor`) and
each reduction is compiled once per formula inside lazykern's compile session
(:func:`lazykern.keops.keops_session`); memory is O((N + M) * D), nothing pairwise is ever
stored. Right-hand sides are zero-padded to :func:`lazykern.keops.padded_size` columns,
which bounds the compiles that CG's and Lanczos' varying widths would trigger. KeOps has no dense
output (the chooser builds dense blocks with the torch engine's row blocks), and its second
derivatives come from the shared row blocks (:func:`lazykern.row_blocks.vjp`).

On a CUDA device KeOps runs only where it passes its health check (:meth:`KeOpsEngine.health`,
:mod:`lazykern.keops.health`); :data:`ENGINE` is the engine as the chooser lists it. The programs it
compiles go to lazykern's KeOps build folder (:func:`lazykern.keops.build_folder`) and, on a GPU,
KeOps' own (:meth:`KeOpsEngine.program_count` counts them).

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> x = torch.randn(300, 3, dtype=torch.float64)
    >>> ENGINE.matmul(StationaryFormula("rbf"), x, x, {}, torch.ones(300, 2, dtype=torch.float64)).shape
    torch.Size([300, 2])
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch
from torch import Tensor

from .. import row_blocks
from ..engine import Engine, Gradients, Plan, ProgramCount
from ..formulas import Formula, declared
from ..row_blocks import pairwise_params
from . import health as gpu_health
from .session import build_folder, keops_lazy_tensor, keops_session, loaded_reductions, padded_size

__all__ = ["ENGINE", "KeOpsEngine"]


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
    again (``create_graph=True``) takes the shared row blocks' (:func:`lazykern.row_blocks.vjp`), since
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
            return (None, None, *row_blocks.vjp(ctx.formula, ctx.names, inputs, wanted, grad_out))
        out, leaves = ctx.graph
        targets = [t for t, w in zip(leaves, wanted) if w]
        grads = iter(torch.autograd.grad(out, targets, grad_out, retain_graph=True, allow_unused=True))
        return (None, None, *(next(grads) if w else None for w in wanted))


class KeOpsEngine(Engine):
    """KeOps' reductions (see the module docstring). Supports any formula whose two sides have at
    least two points (KeOps reads a ``(..., 1, 1, D)`` tensor as a parameter, not as one point, and
    would silently reduce over the wrong axis), with nothing to plan (its plan is ``True``: KeOps
    compiles when it runs); fuses the symmetric gradient of symmetric formulas
    (``formula.symmetric``)."""

    name = "keops"

    def supports(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool | None:
        return True if x1.shape[-2] >= 2 and x2.shape[-2] >= 2 else None

    def matmul(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor,
               plan: Plan | None = None) -> Tensor:
        self.planned(plan, formula, x1, x2, params)
        return _KeOpsMatmul.apply(formula, tuple(params), x1, x2, *params.values(), rhs)

    def padded_width(self, width: int) -> int:
        """:func:`lazykern.keops.padded_size`: one compile serves every width up to the next step."""
        return padded_size(width)

    def program_count(self, device: torch.device) -> ProgramCount:
        """The programs in lazykern's KeOps build folder and, on a GPU, in KeOps' own (cubin or PTX
        files), and the reductions this process has loaded (:func:`lazykern.keops.loaded_reductions`).
        On a CUDA device the health check runs first (once per stack: :meth:`health`): its probe
        compiles into KeOps' folder too, and is no program of the caller's."""
        folders: list[tuple[str, tuple[str, ...]]] = [(build_folder(), ("pykeops_cpp_",))]
        if device.type == "cuda":  # KeOps' GPU reductions go to its own folder, as cubin or PTX files
            from keopscore.config import config

            self.health(device)
            folders.append((config.get_build_folder(), ("cubin_", "ptx_")))
        compiled = sum(name.startswith(prefixes) and not name.endswith((".cpp", ".cu"))
                       for folder, prefixes in folders for name in _entries(folder))
        return ProgramCount(tuple(folder for folder, _ in folders), compiled, loaded_reductions())

    def fuses_symmetric_gradient(self, formula: Formula) -> bool:
        return declared(formula).symmetric

    def health(self, device: Any) -> gpu_health.Health:
        """KeOps' health on a CUDA ``device`` (:func:`lazykern.keops.health.health`: a subprocess the
        first time a driver, NVRTC, keopscore and GPU model are seen)."""
        return gpu_health.health(device)

    def require(self, device: Any) -> None:
        """Raise one ``RuntimeError`` naming the cause where KeOps fails its health check on a CUDA
        ``device`` (:func:`lazykern.keops.health.require`)."""
        gpu_health.require(device)

    def symmetric_gradients(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
                            left: Tensor, right: Tensor, plan: Plan | None = None) -> Gradients | None:
        r"""For a symmetric formula (:math:`k(u, v) = k(v, u)`, stationary or not),
        :math:`\partial k(u, v)/\partial v = \partial k(v, u)/\partial v` (first argument), so with
        :math:`g_{ij} = \partial k(x_i, x_j)/\partial x_i` the gradients are
        :math:`\sum_j \langle l_i, r_j\rangle g_{ij}` for ``x1`` and :math:`\sum_j \langle r_i, l_j\rangle g_{ij}`
        for ``x2``: reductions over j of the same derivative, concatenated into one reduction with the
        parameters' (summed over i afterwards). When ``x1`` *is* ``x2``, one output carries their sum.
        KeOps' own backward would run one reduction per differentiated variable, each re-evaluating
        every exponential."""
        self.planned(plan, formula, x1, x2, params)
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


def _entries(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


#: The KeOps engine, as the chooser (:mod:`lazykern.backend`) lists it.
ENGINE = KeOpsEngine()
