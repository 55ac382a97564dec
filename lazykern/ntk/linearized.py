r"""NTK products without features: :math:`\Theta V = J_1 (J_2^\top V)`.

:math:`J_2^\top V` is one vector-Jacobian product over the column samples (plain autograd, batched
over right-hand sides), :math:`J_1 p` one Jacobian-vector product over the row samples
(:func:`torch.func.jvp` through :func:`torch.func.functional_call`, vmapped over right-hand sides).
Both run in sample batches, so a product costs :math:`O((N_1 + N_2) P)` time per right-hand side
and :math:`O(P)` memory per right-hand side beyond one batch.

For the trace kernel :math:`\sum_o \Theta_{oo}` each output needs its own product, so the cost is
:math:`k` times that of a full-mode product.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vmap

from .features import NetworkInfo, batch_size

__all__ = ["linearized_matmul"]


def _trainable(model: nn.Module) -> dict[str, Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _pullback(model: nn.Module, info: NetworkInfo, x2: Tensor, cot: Tensor) -> dict[str, Tensor]:
    """:math:`\\sum_j J(x_j)^\\top c_{\\cdot j}` for a batch of cotangents ``cot`` ``(R, N2, k)``."""
    params = _trainable(model)
    total = {n: torch.zeros((cot.shape[0], *p.shape), dtype=p.dtype, device=p.device) for n, p in params.items()}
    step = batch_size(info, x2.shape[0])
    with torch.enable_grad():
        for start in range(0, x2.shape[0], step):
            xb = x2[start : start + step]
            out = model(xb).reshape(xb.shape[0], -1)
            grads = torch.autograd.grad(
                out, list(params.values()), grad_outputs=cot[:, start : start + step], is_grads_batched=True,
                allow_unused=True,
            )
            for n, g in zip(params, grads):
                if g is not None:
                    total[n] += g
    return total


def _pushforward(model: nn.Module, info: NetworkInfo, x1: Tensor, tangents: dict[str, Tensor]) -> Tensor:
    """:math:`J(x_i)\\, t_r` for every row sample and each of the ``R`` tangents: ``(R, N1, k)``."""
    params = {n: p.detach() for n, p in _trainable(model).items()}
    step = batch_size(info, x1.shape[0])
    blocks = []
    for start in range(0, x1.shape[0], step):
        xb = x1[start : start + step]

        def f(p: dict[str, Tensor]) -> Tensor:
            return functional_call(model, p, (xb,)).reshape(xb.shape[0], -1)

        blocks.append(vmap(lambda t: jvp(f, (params,), (t,))[1])(tangents))
    return torch.cat(blocks, dim=1)


def linearized_matmul(model: nn.Module, info: NetworkInfo, x1: Tensor, x2: Tensor, rhs: Tensor, mode: str) -> Tensor:
    r""":math:`\Theta(x_1, x_2)\, V` through the network itself.

    Args:
        rhs: ``(N2 * k, C)`` in full mode (row ``j * k + o``), ``(N2, C)`` in trace mode.

    Returns:
        ``(N1 * k, C)`` or ``(N1, C)``.
    """
    k, c, n2 = info.num_outputs, rhs.shape[-1], x2.shape[0]
    with torch.no_grad():
        if mode == "full":
            cot = rhs.reshape(n2, k, c).permute(2, 0, 1)  # (C, N2, k)
        else:
            # cotangent (o, c): v_{jc} on output o only, so that row o of the result is J_o^T v_c
            eye = torch.eye(k, dtype=rhs.dtype, device=rhs.device)
            cot = torch.einsum("jc,op->ocjp", rhs, eye).reshape(k * c, n2, k)
    tangents = _pullback(model, info, x2, cot)
    with torch.no_grad():
        out = _pushforward(model, info, x1, tangents)  # (R, N1, k)
        if mode == "full":
            return out.permute(1, 2, 0).reshape(-1, c)
        out = out.reshape(k, c, -1, k)
        return torch.einsum("ocio->ic", out)
