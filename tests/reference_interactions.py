"""Dense references for interaction kernels, from their definitions (subsets enumerated, measure
integrals by quadrature), independent of lazykern's formulas and engines."""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import Tensor

from .reference import _matern, kernel


def per_dimension(family: str, x1: Tensor, x2: Tensor, lengthscale: Tensor, *, nu: float | None = None,
                  diag: bool = False) -> Tensor:
    """One-dimensional kernel values of every dimension: ``(*b, N, M, D)`` (or ``(*b, N, D)`` with diag).
    ``lengthscale``: ``(*b, 1, D)``."""
    diff = x1 - x2 if diag else x1.unsqueeze(-2) - x2.unsqueeze(-3)
    ls = lengthscale if diag else lengthscale.unsqueeze(-2)
    r = (diff / ls).abs()
    if family == "rbf":
        return torch.exp(-0.5 * r**2)
    if family == "matern":
        return _matern(r, nu)
    raise ValueError(family)


def orders(z: Tensor, order_variances: Tensor, scales: Tensor | None, max_degree: int, *, diag: bool = False) -> Tensor:
    """sum_r sigma_r^2 C(D, r)^-1 sum_{|S| = r} prod_{d in S} s_d z_d, by enumerating every subset S.
    ``z``: ``(*b, N, M, D)``; ``order_variances``: ``(*b, R)``; ``scales``: ``(*b, 1, D)`` or None."""
    d = z.shape[-1]
    if scales is not None:
        z = z * (scales if diag else scales.unsqueeze(-2))
    out = torch.zeros_like(z[..., 0])
    for r in range(1, max_degree + 1):
        total = sum(z[..., list(subset)].prod(-1) for subset in itertools.combinations(range(d), r))
        var = order_variances[..., r - 1]
        var = var.reshape(*var.shape, *([1] * (out.dim() - var.dim())))
        out = out + var * total / math.comb(d, r)
    return out


def orthogonal_rbf(x1: Tensor, x2: Tensor, lengthscale: Tensor, mean: Tensor, std: Tensor, *, diag: bool = False,
                   normalized: bool = False, nodes: int = 200) -> Tensor:
    """k(x, y) - m(x) m(y) / v per dimension for the RBF kernel and N(mean, std^2), with
    m(x) = int k(x, t) p(t) dt and v = int int k(s, t) p(s) p(t) ds dt by Gauss–Hermite quadrature;
    ``normalized``: divided by its average variance int (k(x, x) - m(x)^2 / v) p(x) dx.
    Arguments are non-batch: ``x1`` ``(N, D)``, the rest ``(1, D)``. Returns ``(N, M, D)`` or ``(N, D)``."""
    t, w = np.polynomial.hermite.hermgauss(nodes)
    t = torch.tensor(t, dtype=x1.dtype)
    w = torch.tensor(w, dtype=x1.dtype) / math.sqrt(math.pi)
    k = per_dimension("rbf", x1, x2, lengthscale, diag=diag)
    out = []
    for d in range(x1.shape[-1]):
        ls = lengthscale[..., d]
        points = mean[..., d] + math.sqrt(2) * std[..., d] * t  # nodes of the measure
        rbf = lambda a, b: torch.exp(-0.5 * ((a - b) / ls) ** 2)  # noqa: E731
        m1 = (rbf(x1[:, d : d + 1], points) * w).sum(-1)
        m2 = (rbf(x2[:, d : d + 1], points) * w).sum(-1)
        v = (rbf(points[:, None], points[None]) * w[:, None] * w[None]).sum()
        term = k[..., d] - (m1 * m2 if diag else m1[:, None] * m2[None]) / v
        if normalized:
            m_nodes = (rbf(points[:, None], points[None]) * w).sum(-1)  # m at the nodes
            term = term / (1 - (w * m_nodes**2).sum() / v)
        out.append(term)
    return torch.stack(out, -1)


def group(family: str, x1: Tensor, x2: Tensor, lengthscale: Tensor, groups, scales: Tensor | None = None, *,
          diag: bool = False, **kwargs) -> Tensor:
    """sum_g s_g k(x_g, x'_g), each group's kernel on its own columns (``reference.kernel``, non-additive).
    ``lengthscale``: ``(*b, 1, D)`` or ``(*b, 1, 1)``; ``scales``: ``(*b, 1, G)``; kwargs: nu, alpha, period."""
    out = 0
    for g, dims in enumerate(groups):
        dims = list(dims)
        ls = lengthscale if lengthscale.shape[-1] == 1 else lengthscale[..., dims]
        value = kernel(family, x1[..., dims], x2[..., dims], ls, additive=False, diag=diag, **kwargs)
        weight = 1.0 if scales is None else (scales[..., 0, g : g + 1] if diag else scales[..., g : g + 1])
        out = out + weight * value
    return out


def _gaussian_factors(a, ls, mean, std):
    """The orthogonalized RBF term as a difference of two Gaussians in t, each ``(coef, A, B, C)``
    for ``coef * exp(-A t^2 + B t + C)``: k~(t, a) = exp(-(t - a)^2 / 2l^2) - m(t) m(a) / v, with
    m(t) = l / s exp(-(t - mu)^2 / 2s^2), s^2 = l^2 + std^2 and v = l / sqrt(l^2 + 2 std^2)."""
    import mpmath

    s2 = ls**2 + std**2
    m_a = ls / mpmath.sqrt(s2) * mpmath.exp(-((a - mean) ** 2) / (2 * s2))
    v = ls / mpmath.sqrt(ls**2 + 2 * std**2)
    near = (1, 1 / (2 * ls**2), a / ls**2, -(a**2) / (2 * ls**2))
    projection = (-m_a / v * ls / mpmath.sqrt(s2), 1 / (2 * s2), mean / s2, -(mean**2) / (2 * s2))
    return near, projection


def orthogonal_rbf_l2_exact(a: float, b: float, ls: float, mean: float, std: float, *, digits: int = 50) -> float:
    """C(a, b) = int k~(t, a) k~(t, b) p(t) dt, p = N(mean, std^2), as a sum of closed-form
    Gaussian integrals int exp(-A t^2 + B t + C) dt = sqrt(pi / A) exp(B^2 / 4A + C), evaluated
    with ``digits`` significant digits (mpmath), so that the cancellation between the integrals is
    not the reference's rounding."""
    import mpmath

    with mpmath.workdps(digits):
        a, b, ls, mean, std = (mpmath.mpf(v) for v in (a, b, ls, mean, std))
        density = (1 / (std * mpmath.sqrt(2 * mpmath.pi)), 1 / (2 * std**2), mean / std**2, -(mean**2) / (2 * std**2))
        total = mpmath.mpf(0)
        for f in _gaussian_factors(a, ls, mean, std):
            for g in _gaussian_factors(b, ls, mean, std):
                coef = f[0] * g[0] * density[0]
                big_a, big_b, big_c = (f[i] + g[i] + density[i] for i in (1, 2, 3))
                total += coef * mpmath.sqrt(mpmath.pi / big_a) * mpmath.exp(big_b**2 / (4 * big_a) + big_c)
        return float(total)


def orthogonal_rbf_exact(a: float, b: float, ls: float, mean: float, std: float, *, digits: int = 50) -> float:
    """k~(a, b) = k(a, b) - m(a) m(b) / v (as in :func:`orthogonal_rbf_l2_exact`), with ``digits``
    significant digits: the reference where k and m m' / v agree to many digits (long lengthscales)."""
    import mpmath

    with mpmath.workdps(digits):
        a, b, ls, mean, std = (mpmath.mpf(v) for v in (a, b, ls, mean, std))
        return float(sum(coef * mpmath.exp(-big_a * a**2 + big_b * a + big_c)  # b's two Gaussians at t = a
                         for coef, big_a, big_b, big_c in _gaussian_factors(b, ls, mean, std)))
