r"""NTK products without features: :math:`\Theta V = J_1 (J_2^\top V)`.

:math:`J_2^\top V` is one vector-Jacobian product over the column samples (plain autograd, batched
over right-hand sides), :math:`J_1 p` one Jacobian-vector product over the row samples
(two reverse passes, batched over right-hand sides), both through the rules' substitutes
(:func:`~lazykern.ntk.features.substituted`).
Both run in sample batches, so a product costs :math:`O((N_1 + N_2) P)` time per right-hand side.
Each right-hand side holds parameter-sized buffers (the pulled-back tangent, a batch's gradient and
their sum: :math:`3P` numbers), so the right-hand sides go through in groups whose buffers fit
:func:`~lazykern.ntk.features.batch_bytes`: memory stays bounded however many columns a solver
passes (an embedding's table is parameter-sized, so a large vocabulary's buffers for a few columns
take hundreds of MB: docs/ntk.rst, "Benchmark"). With ``differentiable=True`` both keep
their graphs, so the product differentiates with respect to the inputs and the network's tensors.

For the trace kernel :math:`\sum_o \Theta_{oo}` each output needs its own product, so the cost is
:math:`k` times that of a full-mode product.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .features import Network, batch_bytes, call_params, substituted

__all__ = ["linearized_matmul"]


def _pullback(forward, net: Network, call: dict[str, Tensor], x2: Tensor, cot: Tensor, differentiable: bool) -> dict[str, Tensor]:
    """:math:`\\sum_j J(x_j)^\\top c_{\\cdot j}` for a batch of cotangents ``cot`` ``(R, N2, k)``."""
    leaves = {n: call[n] for n in net.trainable}
    total = {n: torch.zeros((cot.shape[0], *p.shape), dtype=p.dtype, device=p.device) for n, p in leaves.items()}
    step = net.batch_size(x2.shape[0], cot.element_size())
    with torch.enable_grad():
        for start in range(0, x2.shape[0], step):
            xb = x2[start : start + step]
            out = forward(call, xb)
            grads = torch.autograd.grad(
                out, list(leaves.values()), grad_outputs=cot[:, start : start + step], is_grads_batched=True,
                allow_unused=True, create_graph=differentiable,
            )
            for n, g in zip(leaves, grads):
                if g is not None:
                    total[n] = total[n] + g
    return total


def _pushforward(forward, net: Network, call: dict[str, Tensor], x1: Tensor, tangents: dict[str, Tensor], differentiable: bool) -> Tensor:
    r""":math:`J(x_i)\, t_r` for every row sample and each of the ``R`` tangents: ``(R, N1, k)``.

    As the derivative of the linear map :math:`u \mapsto \langle J^\top u, t_r\rangle` (two reverse
    passes) rather than by forward-mode AD: fused inference kernels (the Transformer fast path)
    have no forward-mode derivative, and reverse mode keeps the modules' own forwards running.
    """
    names = [n for n in net.trainable]
    leaves = [call[n] for n in names]
    step = net.batch_size(x1.shape[0], leaves[0].element_size())
    r = next(iter(tangents.values())).shape[0]
    blocks = []
    with torch.enable_grad():
        for start in range(0, x1.shape[0], step):
            xb = x1[start : start + step]
            out = forward(call, xb)
            u = torch.zeros_like(out, requires_grad=True)
            pulled = torch.autograd.grad(out, leaves, grad_outputs=u, create_graph=True, allow_unused=True)
            used = [(g, tangents[n]) for g, n in zip(pulled, names) if g is not None and g.requires_grad]
            if not used:
                blocks.append(out.new_zeros(r, *out.shape))
                continue
            (block,) = torch.autograd.grad(
                [g for g, _ in used], u, grad_outputs=[t for _, t in used], is_grads_batched=True,
                create_graph=differentiable, allow_unused=True,
            )
            blocks.append(out.new_zeros(r, *out.shape) if block is None else block)
    return torch.cat(blocks, dim=1)


def linearized_matmul(
    net: Network, tensors: dict[str, Tensor], x1: Tensor, x2: Tensor, rhs: Tensor, mode: str, differentiable: bool
) -> Tensor:
    r""":math:`\Theta(x_1, x_2)\, V` through the network itself.

    Args:
        tensors: the network's floating parameters and buffers to evaluate with.
        rhs: ``(N2 * k, C)`` in full mode (row ``j * k + o``), ``(N2, C)`` in trace mode.

    Returns:
        ``(N1 * k, C)`` or ``(N1, C)``.
    """
    k, c, n2 = net.num_outputs, rhs.shape[-1], x2.shape[0]
    call = call_params(net.model, tensors, net.trainable)
    if not differentiable:
        x1, x2, rhs = x1.detach(), x2.detach(), rhs.detach()
    if mode == "full":
        cot = rhs.reshape(n2, k, c).permute(2, 0, 1)  # (C, N2, k)
    else:
        # cotangent (o, c): v_{jc} on output o only, so that row o of the result is J_o^T v_c
        eye = torch.eye(k, dtype=rhs.dtype, device=rhs.device)
        cot = torch.einsum("jc,op->ocjp", rhs, eye).reshape(k * c, n2, k)
    per_rhs = 3 * sum(call[n].numel() for n in net.trainable) * rhs.element_size()
    step = max(1, batch_bytes() // per_rhs)
    blocks = []
    with substituted(net) as forward:
        for start in range(0, cot.shape[0], step):
            tangents = _pullback(forward, net, call, x2, cot[start : start + step], differentiable)
            if not differentiable:
                tangents = {n: t.detach() for n, t in tangents.items()}
            blocks.append(_pushforward(forward, net, call, x1, tangents, differentiable))  # (R, N1, k)
    out = torch.cat(blocks)
    if not differentiable:
        out = out.detach()
    if mode == "full":
        return out.permute(1, 2, 0).reshape(-1, c)
    return torch.einsum("ocio->ic", out.reshape(k, c, -1, k))
