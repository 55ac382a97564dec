r"""A preconditioner for sums of one-dimensional kernels: each term interpolated from a grid.

For :math:`A = D + \sum_d s_d K_d` with :math:`K_d` a one-dimensional Matérn or Gaussian kernel
on column :math:`d` of the inputs (divided by the lengthscales) and :math:`D` a positive diagonal
(the noise), each term is replaced by its cubic-convolution interpolant from a regular grid
:math:`G_d` of the column's range (structured kernel interpolation, Wilson & Nickisch 2015, one
grid per dimension as for additive kernels in Gardner et al. 2018; Keys' cubic convolution,
1981):

.. math::

    P = D + \sum_d W_d\, R_d R_d^\top W_d^\top = D + \Phi \Phi^\top, \qquad
    R_d R_d^\top \approx s_d\, K_d(G_d, G_d),

where :math:`W_d` holds four interpolation weights per point (:math:`O(N)` numbers per dimension)
and :math:`R_d = U \operatorname{diag}(\sqrt{s_d \lambda})` keeps the eigenvectors of the grid's
Gram matrix whose largest possible contribution to :math:`P`,
:math:`s_d \lambda \lVert W_d \rVert^2`, is at least :data:`KEPT_FRACTION` of the smallest noise
(the rest could change no eigenvalue of :math:`P` by more than that fraction of the noise). With
:math:`r = \sum_d \operatorname{rank} R_d` and :math:`C = I_r + \Phi^\top D^{-1} \Phi`
(Cholesky-factored once), everything a solver needs is exact for this :math:`P`:

.. math::

    P^{-1} v = D^{-1} v - D^{-1} \Phi\, C^{-1} \Phi^\top D^{-1} v, \qquad
    \log\lvert P \rvert = \sum_i \log D_{ii} + \log\lvert C \rvert, \qquad
    \Phi g + D^{1/2} \varepsilon \sim \mathcal N(0, P)

(Woodbury's identity and the matrix determinant lemma): the three things that conjugate gradients
and stochastic Lanczos quadrature ask of a preconditioner. Memory is :math:`O(N d)` for the
weights and :math:`O(r^2)` for :math:`C`, whatever :math:`N`; building costs
:math:`O(N d^2)` (the blocks :math:`W_d^\top D^{-1} W_e`, one histogram each) and
:math:`O(r^3)`; an application costs :math:`O((N d + r^2) C)`.

The grid's spacing is :data:`GRID_SPACING` lengthscales (at least :data:`MIN_GRID_POINTS` and at
most :data:`MAX_GRID_POINTS` points per dimension). Everything is computed in float64.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import Tensor

from ..formulas import Scaled, StationaryFormula
from .engine import ENGINE

__all__ = ["GRID_SPACING", "KEPT_FRACTION", "MAX_GRID_POINTS", "MIN_GRID_POINTS", "AdditiveGrid", "additive_terms",
           "cubic_weights"]

#: Grid spacing in lengthscales (inputs arrive divided by them).
GRID_SPACING = 0.1
#: Fewest and most grid points per dimension (before the interpolation's padding).
MIN_GRID_POINTS = 16
MAX_GRID_POINTS = 512
#: Eigenvectors of a grid's Gram matrix whose largest contribution to P is below this fraction of
#: the smallest noise are left out of R_d.
KEPT_FRACTION = 1e-3
#: Offsets of the four grid points each point is interpolated from, relative to the one at or below it.
_OFFSETS = (-1, 0, 1, 2)


def cubic_weights(u: Tensor) -> Tensor:
    r"""Keys' cubic-convolution weights (:math:`a = -\tfrac12`) of the grid points ``floor(u) - 1``
    to ``floor(u) + 2`` for positions ``u`` in grid units: ``(..., 4)``, summing to 1, and exact for
    quadratics.

    Example:
        >>> w = cubic_weights(torch.tensor([3.0, 3.25], dtype=torch.float64))
        >>> w[0].abs().tolist(), float(w[1].sum())
        ([0.0, 1.0, 0.0, 0.0], 1.0)
    """
    t = u - torch.floor(u)
    return torch.stack([
        ((-0.5 * t + 1.0) * t - 0.5) * t,
        (1.5 * t - 2.5) * t * t + 1.0,
        ((-1.5 * t + 2.0) * t + 0.5) * t,
        (0.5 * t - 0.5) * t * t,
    ], dim=-1)


def additive_terms(formula: object, x: Tensor, params: Mapping[str, Tensor]) -> tuple[StationaryFormula, Tensor] | None:
    """The one-dimensional kernel and the per-dimension scales ``(*batch, 1, D)`` (an output scale
    folded in) of a formula the structured engine takes on ``K(x, x)``; ``None`` for any other.

    Example:
        >>> x = torch.randn(10, 3, dtype=torch.float64)
        >>> f = StationaryFormula("matern", additive=True, nu=1.5)
        >>> one, scales = additive_terms(Scaled(f), x, {"scales": torch.ones(1, 3), "outputscale": torch.full((1, 1), 2.0)})
        >>> one, scales.tolist()
        (StationaryFormula(family='matern', additive=False, nu=1.5), [[2.0, 2.0, 2.0]])
    """
    if not ENGINE.supports(formula, x, x, params):
        return None
    scaled = isinstance(formula, Scaled)
    base = formula.formula if scaled else formula
    scales = params["scales"] * params["outputscale"] if scaled else params["scales"]
    return StationaryFormula(base.family, nu=base.nu), scales


class AdditiveGrid:
    r""":math:`P = D + \sum_d W_d R_d R_d^\top W_d^\top` for one set of points (no batch): solves,
    products, the log-determinant and samples, exact for this :math:`P` (see the module docstring).

    Args:
        kernel: the one-dimensional kernel (:func:`additive_terms`).
        x: ``(N, D)`` inputs, divided by the lengthscales.
        scales: ``(D,)`` non-negative per-dimension scales.
        noise: ``(N,)`` positive diagonal :math:`D`.

    Example:
        >>> x = torch.rand(500, 2, dtype=torch.float64)
        >>> grid = AdditiveGrid(StationaryFormula("rbf"), x, torch.ones(2), torch.full((500,), 0.1))
        >>> v = torch.randn(500, 3, dtype=torch.float64)
        >>> torch.allclose(grid.matmul(grid.solve(v)), v, atol=1e-10)
        True
    """

    def __init__(self, kernel: StationaryFormula, x: Tensor, scales: Tensor, noise: Tensor) -> None:
        x = x.detach().to(torch.float64)
        scales = scales.detach().to(torch.float64).reshape(-1)
        noise = noise.detach().to(torch.float64).reshape(-1)
        n, dims = x.shape
        if scales.shape[0] != dims or noise.shape[0] != n:
            raise ValueError(f"scales must have {dims} entries and noise {n}, got {scales.shape[0]} and {noise.shape[0]}")
        if not bool((noise > 0).all()) or not bool(torch.isfinite(noise).all()):
            raise ValueError("noise must be positive and finite for a grid preconditioner")
        self.num_points = n
        self.noise = noise
        self.inverse_noise = noise.reciprocal()
        self.index, self.weights = [], []  # per dimension: (N, 4) grid indices and weights
        sizes, grams = [], []
        for d in range(dims):
            index, weights, grid = self._interpolation(x[:, d])
            self.index.append(index)
            self.weights.append(weights)
            sizes.append(grid.shape[0])
            grams.append(kernel(grid[:, None, None], grid[None, :, None]).squeeze(-1) * scales[d])
        floor = KEPT_FRACTION * float(noise.min())
        self.roots = []
        for d in range(dims):
            # ||W_d||^2 <= max(D) ||W_d^T D^{-1} W_d|| <= max(D) times its largest row sum (Gershgorin)
            norm = float(self._histogram(d, d, sizes).abs().sum(1).max()) * float(noise.max())
            values, vectors = torch.linalg.eigh(grams[d])
            keep = values * norm >= floor
            self.roots.append(vectors[:, keep] * values[keep].sqrt())
        self.rank = sum(r.shape[1] for r in self.roots)
        starts = [0]
        for r in self.roots:
            starts.append(starts[-1] + r.shape[1])
        self._slices = [slice(a, b) for a, b in zip(starts[:-1], starts[1:])]
        inner = torch.eye(self.rank, dtype=torch.float64)
        for d in range(dims):
            for e in range(d, dims):  # one (m_d, m_e) histogram at a time
                block = self.roots[d].mT @ self._histogram(d, e, sizes) @ self.roots[e]
                inner[self._slices[d], self._slices[e]] += block
                if e != d:
                    inner[self._slices[e], self._slices[d]] += block.mT
        self.cholesky = torch.linalg.cholesky(inner)
        self.logdet = float(noise.log().sum() + 2 * self.cholesky.diagonal().log().sum())

    @staticmethod
    def _interpolation(t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Grid indices ``(N, 4)``, weights ``(N, 4)`` and the grid of one column: ``m`` points
        from its smallest to its largest value, one more below and two more above."""
        lo, hi = float(t.min()), float(t.max())
        m = min(MAX_GRID_POINTS, max(MIN_GRID_POINTS, math.ceil((hi - lo) / GRID_SPACING) + 1))
        h = (hi - lo) / (m - 1) if hi > lo else 1.0
        grid = lo + h * torch.arange(-1, m + 2, dtype=torch.float64)
        u = (t - lo) / h + 1.0
        below = torch.floor(u).clamp(1, m).long()  # the last point sits at u = m: weights (0, 1, 0, 0)
        weights = cubic_weights(u)
        index = below[:, None] + torch.tensor(_OFFSETS)
        return index, weights, grid

    def _histogram(self, d: int, e: int, sizes: list[int]) -> Tensor:
        """:math:`W_d^\\top D^{-1} W_e`, ``(m_d, m_e)``."""
        out = torch.zeros(sizes[d] * sizes[e], dtype=torch.float64)
        for a in range(len(_OFFSETS)):
            left = self.weights[d][:, a] * self.inverse_noise
            for b in range(len(_OFFSETS)):
                key = self.index[d][:, a] * sizes[e] + self.index[e][:, b]
                out += torch.bincount(key, weights=left * self.weights[e][:, b], minlength=out.shape[0])
        return out.reshape(sizes[d], sizes[e])

    def _project(self, v: Tensor) -> Tensor:
        r""":math:`\Phi^\top v`, ``(r, C)``."""
        parts = []
        for index, weights, root in zip(self.index, self.weights, self.roots):
            gathered = v.new_zeros(root.shape[0], v.shape[-1])
            for a in range(len(_OFFSETS)):
                gathered.index_add_(0, index[:, a], weights[:, a, None] * v)
            parts.append(root.mT @ gathered)
        return torch.cat(parts)

    def _expand(self, c: Tensor) -> Tensor:
        r""":math:`\Phi c`, ``(N, C)``."""
        out = c.new_zeros(self.num_points, c.shape[-1])
        for index, weights, root, part in zip(self.index, self.weights, self.roots, self._slices):
            on_grid = root @ c[part]
            for a in range(len(_OFFSETS)):
                out += weights[:, a, None] * on_grid[index[:, a]]
        return out

    def solve(self, v: Tensor) -> Tensor:
        r""":math:`P^{-1} v` for ``(N, C)`` ``v`` (float64)."""
        scaled = v * self.inverse_noise[:, None]
        inner = torch.cholesky_solve(self._project(scaled), self.cholesky)
        return scaled - self.inverse_noise[:, None] * self._expand(inner)

    def matmul(self, v: Tensor) -> Tensor:
        r""":math:`P v` for ``(N, C)`` ``v`` (float64)."""
        return self.noise[:, None] * v + self._expand(self._project(v))

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        r"""``(N, num_samples)`` draws from :math:`\mathcal N(0, P)`: :math:`\Phi g + D^{1/2} \varepsilon`."""
        g = torch.randn(self.rank, num_samples, dtype=torch.float64, generator=generator)
        eps = torch.randn(self.num_points, num_samples, dtype=torch.float64, generator=generator)
        return self._expand(g) + self.noise.sqrt()[:, None] * eps

    def dense(self) -> Tensor:
        """:math:`P` as an ``(N, N)`` tensor (for checks at small N)."""
        return self.matmul(torch.eye(self.num_points, dtype=torch.float64))
