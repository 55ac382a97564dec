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
(the rest could change no eigenvalue of :math:`P` by more than that fraction of the noise), at
most :data:`MAX_RANK` of them over all dimensions (the largest). With
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

import dataclasses
import math
import warnings
from typing import Mapping

import torch
from torch import Tensor

from ..formulas import Scaled, StationaryFormula
from .forms import additive_form, plan

__all__ = ["GRID_SPACING", "KEPT_FRACTION", "MAX_GRID_POINTS", "MAX_RANK", "MAX_TERMS", "MIN_GRID_POINTS", "AdditiveGrid",
           "additive_terms", "cubic_weights"]

#: Grid spacing in lengthscales (inputs arrive divided by them).
GRID_SPACING = 0.1
#: Fewest grid points per dimension (before the interpolation's padding of three).
MIN_GRID_POINTS = 16
#: Most grid points per dimension (before the padding), so that wider columns get a coarser grid.
MAX_GRID_POINTS = 512
#: Eigenvectors of a grid's Gram matrix whose largest contribution to P is below this fraction of
#: the smallest noise are left out of R_d.
KEPT_FRACTION = 1e-3
#: At most this many directions are kept over all dimensions (those of largest contribution), so that
#: C's Cholesky factor costs at most MAX_RANK^3 / 3 flops (UCI pol, d = 26, kept 2,936 and was built in 1 s).
MAX_RANK = 4096
#: Sums of more terms (a projected kernel's hundreds) keep linear_operator's default preconditioner,
#: since the blocks of C cost O(N) each and there are d^2 / 2 of them.
MAX_TERMS = 64
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
    """The one-dimensional kernel and the per-dimension scales ``(*batch, 1, D)`` (outer scales
    folded in: :func:`lazykern.structured.engine.additive_form`) of a formula the structured engine
    takes on ``K(x, x)`` with at most :data:`MAX_TERMS` terms; ``None`` for any other.

    Example:
        >>> x = torch.randn(10, 3, dtype=torch.float64)
        >>> f = StationaryFormula("matern", additive=True, nu=1.5)
        >>> one, scales = additive_terms(Scaled(f), x, {"scales": torch.ones(1, 3), "outputscale": torch.full((1, 1), 2.0)})
        >>> one, scales.tolist()
        (StationaryFormula(family='matern', additive=False, nu=1.5), [[2.0, 2.0, 2.0]])
    """
    if not plan(formula, x, x, params) or x.shape[-1] > MAX_TERMS:
        return None
    form = additive_form(formula, params)
    return dataclasses.replace(form.terms, additive=False), form.scales


def _csr(crow: Tensor, columns: Tensor, values: Tensor, shape: tuple[int, int], int32: bool) -> Tensor:
    """A CSR matrix, with 32-bit indices where they fit (a third less memory than 64-bit ones)."""
    kind = torch.int32 if int32 else torch.int64
    with warnings.catch_warnings():  # torch calls its CSR layout beta, once per process
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow.to(kind), columns.to(kind), values, shape, check_invariants=False)


class AdditiveGrid:
    r""":math:`P = D + \sum_d W_d R_d R_d^\top W_d^\top` for one set of points (no batch): solves,
    products, the log-determinant and samples, exact for this :math:`P` (see the module docstring).

    Args:
        kernel: the one-dimensional kernel (:func:`additive_terms`).
        x: ``(N, D)`` inputs, divided by the lengthscales.
        scales: ``(D,)`` non-negative per-dimension scales.
        noise: ``(N,)`` positive diagonal :math:`D`.
        max_rank: the most directions kept over all dimensions (the largest), :data:`MAX_RANK` by default.

    Example:
        >>> x = torch.rand(500, 2, dtype=torch.float64)
        >>> grid = AdditiveGrid(StationaryFormula("rbf"), x, torch.ones(2), torch.full((500,), 0.1))
        >>> v = torch.randn(500, 3, dtype=torch.float64)
        >>> torch.allclose(grid.matmul(grid.solve(v)), v, atol=1e-10)
        True
    """

    def __init__(self, kernel: StationaryFormula, x: Tensor, scales: Tensor, noise: Tensor,
                 max_rank: int = MAX_RANK) -> None:
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
        belows, weights = [], []  # per dimension: (N,) the grid point below (or at) each point, (N, 4) weights
        sizes, grams = [], []
        for d in range(dims):
            below, weight, grid = self._interpolation(x[:, d])
            belows.append(below)
            weights.append(weight)
            sizes.append(grid.shape[0])
            grams.append(kernel(grid[:, None, None], grid[None, :, None]).squeeze(-1) * scales[d])
        eigen, reach = [], []
        for d in range(dims):
            # ||W_d||^2 <= max(D) ||W_d^T D^{-1} W_d|| <= max(D) times its largest row sum (Gershgorin)
            histogram = self._histogram(belows[d], weights[d], sizes[d], belows[d], weights[d], sizes[d])
            norm = float(histogram.abs().sum(1).max()) * float(noise.max())
            eigen.append(torch.linalg.eigh(grams[d]))
            reach.append(eigen[-1][0] * norm)  # the most each direction can change P by
        floor = KEPT_FRACTION * float(noise.min())
        largest = torch.cat(reach).sort(descending=True).values
        if largest.shape[0] > max_rank:  # C stays at most max_rank square: the largest directions kept
            floor = max(floor, float(largest[max_rank - 1]))
        self.roots = []
        for (values, vectors), most in zip(eigen, reach):
            keep = (most >= floor) & (values > 0)
            self.roots.append(vectors[:, keep] * values[keep].sqrt())
        self.rank = sum(r.shape[1] for r in self.roots)
        # W = [W_1 ... W_d] as one sparse matrix (4 d entries a row, columns ascending) and its
        # transpose, and R = blockdiag(R_d): an application is two sparse products and small dense
        # ones instead of a loop over dimensions (7x faster at N = 10^4, d = 8).
        offsets = torch.tensor([0, *sizes]).cumsum(0)
        steps = torch.tensor(_OFFSETS)
        columns = torch.cat([below[:, None] + steps + offsets[d] for d, below in enumerate(belows)], dim=1).reshape(-1)
        entries = torch.cat(weights, dim=1).reshape(-1)
        shape = (n, int(offsets[-1]))
        width = 4 * dims
        int32 = n * width < 2**31
        self._interpolate = _csr(torch.arange(0, n * width + 1, width), columns, entries, shape, int32)
        # the transpose: entries by column (a stable sort keeps each column's rows ascending)
        order = torch.argsort(columns, stable=True)
        crow = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(columns, minlength=shape[1]).cumsum(0)])
        self._gather = _csr(crow, order // width, entries[order], shape[::-1], int32)
        self._roots = torch.block_diag(*self.roots)
        inner = torch.eye(self.rank, dtype=torch.float64)
        ends = torch.tensor([r.shape[1] for r in self.roots]).cumsum(0).tolist()
        parts = [slice(end - r.shape[1], end) for end, r in zip(ends, self.roots)]
        for d in range(dims):
            for e in range(d, dims):  # one (m_d, m_e) histogram at a time
                histogram = self._histogram(belows[d], weights[d], sizes[d], belows[e], weights[e], sizes[e])
                block = self.roots[d].mT @ histogram @ self.roots[e]
                inner[parts[d], parts[e]] += block
                if e != d:
                    inner[parts[e], parts[d]] += block.mT
        self.cholesky = torch.linalg.cholesky(inner)
        self.logdet = float(noise.log().sum() + 2 * self.cholesky.diagonal().log().sum())

    @staticmethod
    def _interpolation(t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The grid point at or below each point ``(N,)`` (its four are that one - 1 to + 2), the
        weights ``(N, 4)`` and the grid of one column: ``m`` points from its smallest to its largest
        value, one more below and two more above."""
        lo, hi = float(t.min()), float(t.max())
        m = min(MAX_GRID_POINTS, max(MIN_GRID_POINTS, math.ceil((hi - lo) / GRID_SPACING) + 1))
        h = (hi - lo) / (m - 1) if hi > lo else 1.0
        grid = lo + h * torch.arange(-1, m + 2, dtype=torch.float64)
        u = (t - lo) / h + 1.0
        below = torch.floor(u).clamp(1, m).long()  # the last point sits at u = m: weights (0, 1, 0, 0)
        return below, cubic_weights(u), grid

    def _histogram(self, below: Tensor, weight: Tensor, size: int, other_below: Tensor, other_weight: Tensor,
                   other_size: int) -> Tensor:
        """:math:`W_d^\\top D^{-1} W_e`, ``(m_d, m_e)``: the 16 products of the two points' weights
        summed per pair of grid cells (one ``index_add_``), then placed at their 16 offsets."""
        products = (weight * self.inverse_noise[:, None])[:, :, None] * other_weight[:, None, :]
        cells = torch.zeros(size * other_size, 16, dtype=torch.float64)
        cells.index_add_(0, below * other_size + other_below, products.reshape(-1, 16))
        cells = cells.reshape(size, other_size, 4, 4)
        out = torch.zeros(size, other_size, dtype=torch.float64)
        for a in range(4):  # below runs from 1 to size - 3; its offsets -1 .. 2 from 0 to size - 1
            for b in range(4):
                out[a:size - 3 + a, b:other_size - 3 + b] += cells[1:size - 2, 1:other_size - 2, a, b]
        return out

    def _project(self, v: Tensor) -> Tensor:
        r""":math:`\Phi^\top v = R^\top W^\top v`, ``(r, C)``."""
        return self._roots.mT @ (self._gather @ v)

    def _expand(self, c: Tensor) -> Tensor:
        r""":math:`\Phi c = W R c`, ``(N, C)``."""
        return self._interpolate @ (self._roots @ c)

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

    def diagonal(self) -> Tensor:
        r""":math:`\operatorname{diag}(P) = D + \sum_j \Phi_{ij}^2`, ``(N,)``, from blocks of 64 columns
        of :math:`\Phi` (never all :math:`N \times r` of it, nor :math:`N \times N`)."""
        out = self.noise.clone()
        for start in range(0, self.rank, 64):
            out += (self._interpolate @ self._roots[:, start:start + 64]).square().sum(-1)
        return out

    def dense(self) -> Tensor:
        """:math:`P` as an ``(N, N)`` tensor (for checks at small N)."""
        return self.matmul(torch.eye(self.num_points, dtype=torch.float64))
