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

The grid's spacing is :func:`grid_spacing` lengthscales (at least :data:`MIN_GRID_POINTS` and at
most :data:`MAX_GRID_POINTS` points per dimension). Everything is computed in float64.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import warnings
from pathlib import Path
from typing import Mapping, NamedTuple

import torch
from torch import Tensor

from ..formulas import Formula, Scaled, StationaryFormula
from ..native import load_file
from .forms import additive_form, plan

__all__ = ["GRID_SPACING", "KEPT_FRACTION", "MAX_GRID_POINTS", "MAX_RANK", "MAX_SPACING", "MIN_GRID_POINTS",
           "MIN_SPACING", "TAIL_FRACTION", "CLIP_BELOW", "HEAVY_TAIL", "AdditiveGrid", "grid_spacing",
           "additive_terms", "cubic_weights"]

#: Grid spacing in lengthscales (inputs arrive divided by them) of a term whose scale equals the
#: noise; a term's spacing is this times (noise / scale)^(1/3), within [MIN_SPACING, MAX_SPACING]
#: (:func:`grid_spacing`).
GRID_SPACING = 0.2
#: The finest and the coarsest spacing of a grid, in lengthscales.
MIN_SPACING, MAX_SPACING = 0.05, 0.5
#: The grid of a term whose scale is at most CLIP_BELOW times the noise, on a heavy-tailed column
#: (the middle between this quantile and one minus it less than HEAVY_TAIL of the whole range), spans
#: only that middle: the points beyond take no part in that term's low-rank part (their rows of W are
#: zero there), which changes P by less than its diagonal D does, so that a few outliers do not
#: stretch the grid over hundreds of lengthscales (measured: docs/structured.rst). Other terms keep
#: every point on their grids: a point off a term large against the noise costs iterations.
TAIL_FRACTION = 1e-3
CLIP_BELOW = 0.1
HEAVY_TAIL = 0.3
#: Fewest grid points per dimension (before the interpolation's padding of three).
MIN_GRID_POINTS = 16
#: Most grid points per dimension (before the padding), so that wider columns get a coarser grid.
MAX_GRID_POINTS = 512
#: Eigenvectors of a grid's Gram matrix whose largest contribution to P is below this fraction of
#: the smallest noise are left out of R_d.
KEPT_FRACTION = 1e-3
#: At most this many directions are kept over all dimensions (those of largest contribution), so that
#: C's Cholesky factor costs at most MAX_RANK^3 / 3 flops (build times: docs/structured.rst).
MAX_RANK = 4096
#: Offsets of the four grid points each point is interpolated from, relative to the one at or below it.
_OFFSETS = (-1, 0, 1, 2)
#: The most bytes of rows of :math:`W^\top D^{-1} W` held at once while C is assembled.
_ROWS_BYTES = 64 * 2**20
_GRID_SOURCE = str(Path(__file__).with_name("grid.c"))
_GRID_ARGTYPES = [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 6
_TRANSPOSE_ARGTYPES = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 6


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


def additive_terms(formula: Formula, x: Tensor, params: Mapping[str, Tensor]) -> tuple[StationaryFormula, Tensor] | None:
    """The one-dimensional kernel and the per-dimension scales ``(*batch, 1, D)`` (outer scales
    folded in: :func:`lazykern.structured.engine.additive_form`) of a formula the structured engine
    takes on ``K(x, x)`` ; ``None`` for any other.

    Example:
        >>> x = torch.randn(10, 3, dtype=torch.float64)
        >>> f = StationaryFormula("matern", additive=True, nu=1.5)
        >>> one, scales = additive_terms(Scaled(f), x, {"scales": torch.ones(1, 3), "outputscale": torch.full((1, 1), 2.0)})
        >>> one, scales.tolist()
        (StationaryFormula(family='matern', additive=False, nu=1.5), [[2.0, 2.0, 2.0]])
    """
    if not plan(formula, x, x, params):
        return None
    form = additive_form(formula, params)
    assert form is not None  # planned above
    return dataclasses.replace(form.terms, additive=False), form.scales


def grid_spacing(scales: Tensor, noise: float) -> Tensor:
    r"""Each term's grid spacing in lengthscales: :data:`GRID_SPACING`
    :math:`\cdot (\sigma^2 / s_d)^{1/3}` within [:data:`MIN_SPACING`, :data:`MAX_SPACING`].

    Cubic convolution's error in a smooth kernel shrinks as the cube of the spacing, and what it
    must stay below is the noise the preconditioner's :math:`D` holds: a term large against the
    noise (a small-noise fit) needs a fine grid, one of the noise's size a coarse one, which costs a
    fraction of the points (``docs/structured.rst`` has the iterations each took).

    Args:
        scales: ``(D,)`` the terms' scales :math:`s_d`.
        noise: the smallest noise variance :math:`\sigma^2`.

    Example:
        >>> grid_spacing(torch.tensor([0.001, 0.01, 0.1, 100.0], dtype=torch.float64), 0.01).tolist()
        [0.4308869380063768, 0.2, 0.09283177667225559, 0.05]
    """
    ratio = (noise / scales.clamp_min(torch.finfo(scales.dtype).tiny)).pow(1.0 / 3.0)
    return (GRID_SPACING * ratio).clamp(MIN_SPACING, MAX_SPACING)


def _csr(crow: Tensor, columns: Tensor, values: Tensor, shape: tuple[int, int], int32: bool) -> Tensor:
    """A CSR matrix, with 32-bit indices where they fit (a third less memory than 64-bit ones)."""
    kind = torch.int32 if int32 else torch.int64
    with warnings.catch_warnings():  # torch calls its CSR layout beta, once per process
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow.to(kind), columns.to(kind), values, shape, check_invariants=False)


class _Axes(NamedTuple):
    """Every term's grid: term ``d`` has ``sizes[d]`` points from ``lo[d] - step[d]`` to
    ``lo[d] + (sizes[d] - 2) step[d]`` (the interpolation's padding included); a value ``t`` sits at
    ``(t - lo) / step + 1`` in grid units. Where ``clipped[d]``, the grid spans only the middle of its
    column and values beyond ``[lo[d], hi[d]]`` stay off it."""

    lo: Tensor
    hi: Tensor
    step: Tensor
    sizes: Tensor
    clipped: Tensor

    @classmethod
    def spanning(cls, span: Tensor, spacing: Tensor, clip: Tensor) -> "_Axes":
        """The grids of the columns of ``span`` ``(N, D)``: ``m`` points from each column's smallest
        to its largest value (where ``clip`` and the column is heavy-tailed, :data:`HEAVY_TAIL`, from
        its :data:`TAIL_FRACTION` quantile to its ``1 - TAIL_FRACTION`` one), ``spacing`` ``(D,)`` apart (between :data:`MIN_GRID_POINTS` and
        :data:`MAX_GRID_POINTS`), one more below and two more above."""
        lo, hi = span.min(0).values, span.max(0).values
        k = int(TAIL_FRACTION * span.shape[0])
        if k and bool(clip.any()):
            middle_lo, middle_hi = span.kthvalue(k, dim=0).values, span.kthvalue(span.shape[0] + 1 - k, dim=0).values
            clipped = clip & (middle_hi - middle_lo < HEAVY_TAIL * (hi - lo))
            lo, hi = torch.where(clipped, middle_lo, lo), torch.where(clipped, middle_hi, hi)
        else:
            clipped = torch.zeros_like(clip)
        m = ((hi - lo) / spacing).ceil().long().add(1).clamp(MIN_GRID_POINTS, MAX_GRID_POINTS)
        step = torch.where(hi > lo, (hi - lo) / (m - 1), torch.ones_like(lo))
        return cls(lo, hi, step, m + 3, clipped)

    def nodes(self, d: int) -> Tensor:
        return self.lo[d] + self.step[d] * torch.arange(-1, int(self.sizes[d]) - 1, dtype=torch.float64)

    def locate(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The grid point at or below each value of ``x`` ``(N, D)`` on its term's grid (its four are
        that one - 1 to + 2), ``(N, D)``, and the weights ``(N, D, 4)``; values beyond a clipped
        grid have none (zeros), beyond another one its end cells' weights."""
        last = (self.sizes - 3).to(x)
        u = torch.minimum(((x - self.lo) / self.step + 1.0).clamp_min(1.0), last)
        below = torch.minimum(torch.floor(u).clamp_min(1), last).long()  # the last point sits at u = m: (0, 1, 0, 0)
        weights = cubic_weights(u)
        off = self.clipped & ((x < self.lo) | (x > self.hi))
        return below.contiguous(), weights.masked_fill(off[..., None], 0.0).contiguous()


class AdditiveGrid:
    r""":math:`P = D + \sum_d W_d R_d R_d^\top W_d^\top` for one set of points (no batch): solves,
    products, the log-determinant, samples and the posterior variance of its model, exact for this
    :math:`P` (see the module docstring).

    Args:
        kernel: the one-dimensional kernel (:func:`additive_terms`).
        x: ``(N, D)`` inputs, divided by the lengthscales (for a projected kernel, the projections).
        scales: ``(D,)`` non-negative per-dimension scales.
        noise: ``(N,)`` positive diagonal :math:`D`.
        max_rank: the most directions kept over all dimensions (the largest), :data:`MAX_RANK` by default.
        extent: ``(M, D)`` more points the grids must span (test points whose
            :meth:`posterior_variance` is wanted), or ``None``.

    Example:
        >>> x = torch.rand(500, 2, dtype=torch.float64)
        >>> grid = AdditiveGrid(StationaryFormula("rbf"), x, torch.ones(2), torch.full((500,), 0.1))
        >>> v = torch.randn(500, 3, dtype=torch.float64)
        >>> torch.allclose(grid.matmul(grid.solve(v)), v, atol=1e-10)
        True
    """

    def __init__(self, kernel: StationaryFormula, x: Tensor, scales: Tensor, noise: Tensor,
                 max_rank: int = MAX_RANK, extent: Tensor | None = None) -> None:
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
        # A term small against the noise may leave its outliers off the grid (they change P by less
        # than D does); test points must lie on the grids whose variance they ask (extent): no clipping.
        clip = (scales <= CLIP_BELOW * float(noise.min())) & (extent is None)
        span = x if extent is None else torch.cat([x, extent.detach().to(torch.float64)])
        self.axes = _Axes.spanning(span, grid_spacing(scales, float(noise.min())), clip)
        self._offsets = torch.cat([torch.zeros(1, dtype=torch.int64), self.axes.sizes.cumsum(0)])
        below, weight = self.axes.locate(x)
        self.roots = self._roots_kept(kernel, scales, below, weight, max_rank)
        self.rank = sum(r.shape[1] for r in self.roots)
        self._interpolate = self._weights_matrix(below, weight)
        self._gather = self._transpose(below, weight)
        self._roots, self._roots_t = _block_diagonal(self.roots)
        self.cholesky = torch.linalg.cholesky(self._inner(below, weight))
        self.logdet = float(noise.log().sum() + 2 * self.cholesky.diagonal().log().sum())

    def _roots_kept(self, kernel: StationaryFormula, scales: Tensor, below: Tensor, weight: Tensor,
                    max_rank: int) -> list[Tensor]:
        r""":math:`R_d`: the eigenvectors of each grid's Gram matrix, scaled by the roots of their
        eigenvalues, whose largest possible contribution to P, :math:`s_d \lambda \lVert W_d \rVert^2`,
        is at least :data:`KEPT_FRACTION` of the smallest noise, at most ``max_rank`` of them (the largest).

        :math:`\lVert W_d \rVert^2 \le \max(D) \lVert W_d^\top D^{-1} W_d \rVert`, and by Gershgorin that
        norm is at most the largest row sum :math:`\max_a \sum_i |w_{ia}| D_i^{-1} \lVert w_i \rVert_1`
        (one scatter of every point's weights, all dimensions at once)."""
        dims, widest = below.shape[1], int(self.axes.sizes.max())
        cells = (below + torch.arange(dims) * widest)[..., None] + torch.tensor(_OFFSETS)    # (N, D, 4)
        mass = weight.abs() * (weight.abs().sum(-1, keepdim=True) * self.inverse_noise[:, None, None])
        sums = torch.zeros(dims * widest, dtype=torch.float64).index_add_(0, cells.reshape(-1), mass.reshape(-1))
        norms = sums.view(dims, widest).max(1).values * float(self.noise.max())
        eigen, reach = [], []
        for d in range(dims):
            nodes = self.axes.nodes(d)
            gram = kernel(nodes[:, None, None], nodes[None, :, None]).squeeze(-1) * scales[d]
            eigen.append(torch.linalg.eigh(gram))
            reach.append(eigen[-1][0] * norms[d])
        floor = KEPT_FRACTION * float(self.noise.min())
        largest = torch.cat(reach).sort(descending=True).values
        if largest.shape[0] > max_rank:  # C stays at most max_rank square: the largest directions kept
            floor = max(floor, float(largest[max_rank - 1]))
        roots = []
        for (values, vectors), most in zip(eigen, reach):
            keep = (most >= floor) & (values > 0)
            roots.append(vectors[:, keep] * values[keep].sqrt())
        return roots

    def _weights_matrix(self, below: Tensor, weight: Tensor) -> Tensor:
        """:math:`W = [W_1 \\dots W_D]`, ``(N, sum of grid sizes)``, as a sparse CSR matrix (4 D entries
        a row, columns ascending): an application is two sparse products and small ones instead of
        a loop over dimensions."""
        rows, dims = below.shape
        columns = ((below + self._offsets[:-1])[..., None] + torch.tensor(_OFFSETS)).reshape(-1)
        width = 4 * dims
        return _csr(torch.arange(0, rows * width + 1, width), columns, weight.reshape(-1),
                    (rows, int(self._offsets[-1])), int32=rows * width < 2**31)

    def _transpose(self, below: Tensor, weight: Tensor) -> Tensor:
        """:math:`W^\\top` as a sparse CSR matrix, by a counting pass in C (a sparse product with a
        transposed CSR matrix is an order of magnitude slower than with this one)."""
        rows, dims = below.shape
        width, entries = int(self._offsets[-1]), 4 * rows * dims
        if entries >= 2**31:
            return self._interpolate.to_sparse_coo().t().to_sparse_csr()
        crow = torch.empty(width + 1, dtype=torch.int64)
        points = torch.empty(entries, dtype=torch.int32)
        values = torch.empty(entries, dtype=torch.float64)
        transpose = load_file(_GRID_SOURCE, "lk_grid_transpose", _TRANSPOSE_ARGTYPES)
        transpose(rows, dims, width, self._offsets.data_ptr(), below.data_ptr(), weight.data_ptr(), crow.data_ptr(),
                  points.data_ptr(), values.data_ptr())
        return _csr(crow, points, values, (width, rows), int32=True)

    def _inner(self, below: Tensor, weight: Tensor) -> Tensor:
        r""":math:`C = I_r + R^\top W^\top D^{-1} W R`, its blocks :math:`R_d^\top (W_d^\top D^{-1} W_e) R_e`
        from the rows of :math:`H = W^\top D^{-1} W` that ``grid.c`` sums (a few terms at a time,
        so that at most :data:`_ROWS_BYTES` of H are held)."""
        dims, width = below.shape[1], int(self._offsets[-1])
        sizes_of = self.axes.sizes.tolist()
        ranks = torch.tensor([0, *(r.shape[1] for r in self.roots)]).cumsum(0).tolist()
        upper = torch.zeros(self.rank, self.rank, dtype=torch.float64)        # block rows d, columns e >= d
        rows_fn = load_file(_GRID_SOURCE, "lk_grid_rows", _GRID_ARGTYPES)
        start = 0
        while start < dims:
            stop, held = start + 1, sizes_of[start] * width
            while stop < dims and held + sizes_of[stop] * width <= _ROWS_BYTES // 8:
                held += sizes_of[stop] * width
                stop += 1
            sizes = [sizes_of[d] * width for d in range(start, stop)]
            out_start = torch.tensor([0, *sizes[:-1]], dtype=torch.int64).cumsum(0)
            out = torch.zeros(held, dtype=torch.float64)
            rows_fn(self.num_points, dims, start, stop, width, self._offsets.data_ptr(), below.data_ptr(),
                    weight.data_ptr(), self.inverse_noise.data_ptr(), out_start.data_ptr(), out.data_ptr())
            for k, d in enumerate(range(start, stop)):
                block = out[int(out_start[k]):int(out_start[k]) + sizes[k]].view(sizes_of[d], width)
                projected = self.roots[d].mT @ block                         # (r_d, width)
                upper[ranks[d]:ranks[d + 1]] = (self._roots_t @ projected.mT.contiguous()).mT
            start = stop
        inner = upper + upper.mT
        for d in range(dims):  # the diagonal blocks were summed whole, and counted twice above
            part = slice(ranks[d], ranks[d + 1])
            inner[part, part] -= upper[part, part]
        inner.diagonal().add_(1.0)
        return inner

    def _project(self, v: Tensor) -> Tensor:
        r""":math:`\Phi^\top v = R^\top W^\top v`, ``(r, C)``."""
        return self._roots_t @ (self._gather @ v)

    def _expand(self, c: Tensor) -> Tensor:
        r""":math:`\Phi c = W R c`, ``(N, C)``."""
        return self._interpolate @ (self._roots @ c)

    def _inner_solve(self, c: Tensor) -> Tensor:
        r""":math:`C^{-1} c` by two triangular solves (``torch.cholesky_solve`` copies the factor each call)."""
        half = torch.linalg.solve_triangular(self.cholesky, c, upper=False)
        return torch.linalg.solve_triangular(self.cholesky.mT, half, upper=True)

    def solve(self, v: Tensor) -> Tensor:
        r""":math:`P^{-1} v` for ``(N, C)`` ``v`` (float64)."""
        scaled = v * self.inverse_noise[:, None]
        inner = self._inner_solve(self._project(scaled))
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
        r""":math:`\operatorname{diag}(P) = D + \sum_j \Phi_{ij}^2`, ``(N,)``, one dimension's columns
        of :math:`\Phi` at a time (never all :math:`N \times r` of it, nor :math:`N \times N`)."""
        out = self.noise.clone()
        for d, root in enumerate(self.roots):
            rows = slice(int(self._offsets[d]), int(self._offsets[d + 1]))
            columns = torch.zeros(int(self._offsets[-1]), root.shape[1], dtype=torch.float64)
            columns[rows] = root
            out += (self._interpolate @ columns).square().sum(-1)
        return out

    def posterior_variance(self, x: Tensor) -> Tensor:
        r"""The latent posterior variance of the grid's own model at the rows of ``x``:
        :math:`\phi_*^\top C^{-1} \phi_*`, ``(M,)``, where :math:`\phi_*^\top = w_*^\top R` is the
        point's row of :math:`\Phi` (its interpolation weights on each grid).

        For the model :math:`y = f + \varepsilon` with :math:`\operatorname{Cov} f = \Phi \Phi^\top`
        and noise :math:`D`, the posterior variance at a point of features :math:`\phi_*` is
        :math:`\phi_*^\top \phi_* - \phi_*^\top \Phi^\top P^{-1} \Phi \phi_*`, and Woodbury's identity
        gives :math:`\Phi^\top P^{-1} \Phi = I - C^{-1}`. Where the grids resolve the kernel (its
        interpolation error and the directions left out small against the noise) this is the exact
        model's variance, at :math:`O(r^2)` per point instead of a solve with :math:`N` unknowns.

        Args:
            x: ``(M, D)`` points, divided by the lengthscales as the inputs were, within the grids
                (the inputs' range, or ``extent``'s); points beyond take the grids' end values.

        Example:
            >>> x = torch.rand(400, 2, dtype=torch.float64)
            >>> grid = AdditiveGrid(StationaryFormula("matern", nu=2.5), x, torch.ones(2), torch.full((400,), 0.1))
            >>> phi = grid._expand(torch.eye(grid.rank, dtype=torch.float64))        # Phi, (N, r)
            >>> prior = phi @ phi.mT                                                  # its model's K
            >>> exact = (prior.diagonal() - (prior * grid.solve(prior)).sum(0))[:5]
            >>> torch.allclose(grid.posterior_variance(x[:5]), exact, atol=1e-10)
            True
        """
        x = x.detach().to(torch.float64)
        out = torch.empty(x.shape[0], dtype=torch.float64)
        for start in range(0, x.shape[0], 1024):  # (1024, r) features at a time
            chunk = x[start:start + 1024]
            weights = self._weights_matrix(*self.axes.locate(chunk))
            features = self._roots_t @ weights.to_dense().mT.contiguous()     # (r, chunk)
            out[start:start + chunk.shape[0]] = torch.linalg.solve_triangular(self.cholesky, features, upper=False).square().sum(0)
        return out

    def dense(self) -> Tensor:
        """:math:`P` as an ``(N, N)`` tensor (for checks at small N)."""
        return self.matmul(torch.eye(self.num_points, dtype=torch.float64))


def _block_diagonal(blocks: list[Tensor]) -> tuple[Tensor, Tensor]:
    """The block-diagonal matrix of ``blocks`` and its transpose as sparse CSR matrices (the grids'
    roots: a dense one would hold every grid's rows against every other's columns)."""
    def csr(parts: list[Tensor]) -> Tensor:
        row_starts = torch.tensor([0, *(p.shape[1] for p in parts)]).cumsum(0)
        columns = torch.cat([(torch.arange(p.shape[1]) + int(c)).repeat(p.shape[0]) for p, c in zip(parts, row_starts)])
        counts = torch.cat([torch.full((p.shape[0],), p.shape[1]) for p in parts])
        crow = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        shape = (sum(p.shape[0] for p in parts), int(row_starts[-1]))
        return _csr(crow, columns, torch.cat([p.reshape(-1) for p in parts]), shape, int32=columns.numel() < 2**31)

    return csr(blocks), csr([b.mT.contiguous() for b in blocks])
