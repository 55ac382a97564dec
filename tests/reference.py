"""Dense kernel references written from the math, independent of lazykern's formulas and engines."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _pairwise_diff(x1: Tensor, x2: Tensor, diag: bool) -> Tensor:
    return x1 - x2 if diag else x1.unsqueeze(-2) - x2.unsqueeze(-3)


def _matern(r: Tensor, nu: float) -> Tensor:
    if nu == 0.5:
        return torch.exp(-r)
    if nu == 1.5:
        return (1 + math.sqrt(3) * r) * torch.exp(-math.sqrt(3) * r)
    return (1 + math.sqrt(5) * r + 5.0 / 3.0 * r**2) * torch.exp(-math.sqrt(5) * r)


def kernel(
    family: str,
    x1: Tensor,
    x2: Tensor,
    lengthscale: Tensor,
    *,
    additive: bool,
    scales: Tensor | None = None,
    nu: float | None = None,
    alpha: Tensor | None = None,
    period: Tensor | None = None,
    diag: bool = False,
) -> Tensor:
    """k(x1, x2) for GPyTorch-shaped hyperparameters: lengthscale/period/scales ``(*b, 1, D or 1)``,
    alpha ``(*b, 1)``. Returns ``(*b, N, M)`` or, with ``diag``, ``(*b, N)``."""
    diff = _pairwise_diff(x1, x2, diag)  # (..., N, [M,] D)
    expand = (lambda p: p) if diag else (lambda p: p.unsqueeze(-2))  # (*b, 1, D) -> (*b, 1, 1, D)
    ls = expand(lengthscale)
    if family == "periodic":
        per_dim = torch.sin(math.pi * diff / expand(period)) ** 2 / ls  # GPyTorch: exp(-2 sum sin^2(pi d/p)/l)
        k_of = lambda t: torch.exp(-2 * t)  # noqa: E731
    else:
        per_dim = (diff / ls) ** 2
        if family == "rbf":
            k_of = lambda t: torch.exp(-t / 2)  # noqa: E731
        elif family == "matern":
            k_of = lambda t: _matern(torch.sqrt(t), nu)  # noqa: E731
        elif family == "rq":

            def k_of(t: Tensor) -> Tensor:
                a = alpha.reshape(*alpha.shape[:-1], *([1] * (t.dim() - alpha.dim() + 1)))
                return (1 + t / (2 * a)) ** (-a)

        else:
            raise ValueError(family)
    if additive:
        s = torch.ones_like(per_dim[..., :1, :]) if scales is None else expand(scales)
        return (s * k_of(per_dim)).sum(-1)
    return k_of(per_dim.sum(-1))
