r"""The empirical NTK as a ``linear_operator`` ``LinearOperator`` and :func:`empirical_ntk`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor, nn

from .. import settings
from ..validation import check_floating_matrix
from . import features as feat
from .linearized import linearized_matmul
from .pairwise import dense_blocks, diagonal, entries, pairwise_matmul

__all__ = ["NTKOperator", "empirical_ntk", "MODES", "BACKENDS", "choose_backend"]

MODES = ("full", "trace")
BACKENDS = ("auto", "keops", "dense", "linearized")

# Measured throughputs on the 2-core development CPU (see docs/ntk.rst, "Choosing a backend"), in
# multiply-adds per second: the pairwise work of a tiled BLAS product, of a KeOps reduction, and
# the per-parameter work of a vector-Jacobian plus a Jacobian-vector product through the network.
RATE_DENSE = 1.5e10
RATE_KEOPS = 1.2e8
RATE_LINEARIZED = 1.5e9
# Extracting features costs about one forward and k backward passes: per sample and parameter.
RATE_FEATURES = 1.5e9


@dataclass
class _Side:
    """One set of samples and, once a backend needs them, their features."""

    x: Tensor
    features: feat.Features | None = None

    def index(self, idx: slice | Tensor) -> "_Side":
        return _Side(self.x[idx], None if self.features is None else self.features.index(idx))


class _Plan:
    """Everything an :class:`NTKOperator` shares with the copies ``linear_operator`` makes of it."""

    def __init__(self, model: nn.Module, info: feat.NetworkInfo, mode: str, backend: str, side1: _Side, side2: _Side):
        self.model, self.info, self.mode, self.backend = model, info, mode, backend
        self.side1, self.side2 = side1, side2

    @property
    def k(self) -> int:
        return self.info.num_outputs

    def transposed(self) -> "_Plan":
        return _Plan(self.model, self.info, self.mode, self.backend, self.side2, self.side1)

    def subset(self, rows: slice | Tensor | None, cols: slice | Tensor | None) -> "_Plan":
        side1 = self.side1 if rows is None else self.side1.index(rows)
        side2 = self.side2 if cols is None else self.side2.index(cols)
        return _Plan(self.model, self.info, self.mode, self.backend, side1, side2)

    def features(self, side: _Side) -> feat.Features:
        if side.features is None:
            side.features = feat.extract(self.model, self.info, side.x)
        return side.features

    def cached_features(self) -> tuple[feat.Features, feat.Features]:
        return self.features(self.side1), self.features(self.side2)


def choose_backend(info: feat.NetworkInfo, n1: int, n2: int, num_rhs: int, mode: str, features_cached: bool) -> str:
    r"""The backend ``backend="auto"`` uses for one product with ``num_rhs`` columns.

    Estimated seconds, with the throughputs measured on this machine (module constants):

    .. math::

        t_\text{pairwise} = \frac{N_1 N_2 \sum_l (F_l + H_l C)}{R} + t_\text{features}, \qquad
        t_\text{linearized} = \frac{(N_1 + N_2)\, P\, C\, (k \text{ in trace mode})}{R_\text{lin}},

    with :math:`F_l + k H_l + C` per pair in trace mode and :math:`R` the dense (BLAS) or KeOps
    rate. Backends that need features (``"dense"``, ``"keops"``) are skipped when the features of
    both sides would exceed :class:`lazykern.settings.max_dense_bytes`.
    """
    k, c = info.num_outputs, num_rhs
    if mode == "full":
        per_pair = sum(f + h * c for f, h in info.implicit_dims)
    else:
        per_pair = sum(f + k * h + c for f, h in info.implicit_dims)
    pairwise = n1 * n2 * per_pair
    # the explicit term is low rank: (N1 + N2) * k * P_explicit per column
    pairwise += (n1 + n2) * k * info.explicit_dim * c
    extraction = 0.0 if features_cached else (n1 + n2) * info.num_params * (1 + k) / RATE_FEATURES
    times = {
        "linearized": (n1 + n2) * info.num_params * c * (k if mode == "trace" else 1) / RATE_LINEARIZED,
    }
    if features_cached or feat.feature_bytes(info, n1 + n2) <= settings.max_dense_bytes.value():
        times["dense"] = pairwise / RATE_DENSE + extraction
        times["keops"] = pairwise / RATE_KEOPS + extraction
    return min(times, key=times.get)


class NTKOperator(LinearOperator):
    r"""The empirical NTK :math:`\Theta(x^{(1)}, x^{(2)})` of a network, never stored.

    Build it with :func:`empirical_ntk`. Full mode: shape ``(N1 * k, N2 * k)``, row ``i * k + o``;
    trace mode: ``(N1, N2)``. Products run on the backend chosen at construction
    (``"auto"``: per product, by :func:`choose_backend`); the diagonal, gathered entries and
    :meth:`to_dense` always come from per-layer features.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
        >>> K = empirical_ntk(net, torch.randn(5, 3, dtype=torch.float64))
        >>> (K @ torch.ones(10, dtype=torch.float64)).shape
        torch.Size([10])
    """

    def __init__(self, x1: Tensor, x2: Tensor, *, plan: _Plan) -> None:
        super().__init__(x1, x2, plan=plan)
        self.plan = plan

    # ------------------------------------------------------------------ structure
    def _size(self) -> torch.Size:
        n1, n2 = self.plan.side1.x.shape[0], self.plan.side2.x.shape[0]
        if self.plan.mode == "full":
            return torch.Size((n1 * self.plan.k, n2 * self.plan.k))
        return torch.Size((n1, n2))

    @property
    def num_outputs_per_input(self) -> tuple[int, int]:
        """Rows and columns per sample (``k`` in full mode, 1 in trace mode), as in ``KernelLinearOperator``."""
        k = self.plan.k if self.plan.mode == "full" else 1
        return k, k

    def _transpose_nonbatch(self) -> "NTKOperator":
        plan = self.plan.transposed()
        return NTKOperator(plan.side1.x, plan.side2.x, plan=plan)

    # ------------------------------------------------------------------ products
    def _backend_for(self, num_rhs: int) -> str:
        plan = self.plan
        if plan.backend != "auto":
            return plan.backend
        cached = plan.side1.features is not None and plan.side2.features is not None
        return choose_backend(plan.info, plan.side1.x.shape[0], plan.side2.x.shape[0], num_rhs, plan.mode, cached)

    def _matmul(self, rhs: Tensor) -> Tensor:
        vector = rhs.dim() == 1
        rhs2 = rhs.unsqueeze(-1) if vector else rhs
        batch = rhs2.shape[:-2]
        # batch dimensions of the right-hand side become extra columns
        cols = rhs2.reshape(-1, *rhs2.shape[-2:]).permute(1, 0, 2).reshape(rhs2.shape[-2], -1)
        backend = self._backend_for(cols.shape[-1])
        plan = self.plan
        with torch.no_grad():
            if backend == "linearized":
                out = linearized_matmul(plan.model, plan.info, plan.side1.x, plan.side2.x, cols, plan.mode)
            else:
                f1, f2 = plan.cached_features()
                out = pairwise_matmul(f1, f2, cols, plan.mode, backend)
        out = out.reshape(out.shape[0], -1, rhs2.shape[-1]).permute(1, 0, 2).reshape(*batch, out.shape[0], -1)
        return out.squeeze(-1) if vector else out

    def to_dense(self) -> Tensor:
        with torch.no_grad():
            f1, f2 = self.plan.cached_features()
            return dense_blocks(f1, f2, self.plan.mode)

    def _diagonal(self) -> Tensor:
        plan = self.plan
        if plan.side1.x.shape[0] != plan.side2.x.shape[0]:
            raise ValueError(f"the diagonal needs a square operator, got shape {tuple(self.shape)}")
        with torch.no_grad():
            if plan.side1 is plan.side2 and plan.side1.features is None:
                # stream: the diagonal needs no stored features, only O(N) output
                parts: list[Tensor] = []
                feat.stream(plan.model, plan.info, plan.side1.x, lambda rows, f: parts.append(diagonal(f, f, plan.mode)))
                return torch.cat(parts)
            f1, f2 = plan.cached_features()
            return diagonal(f1, f2, plan.mode)

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        rows, cols = torch.broadcast_tensors(row_index, col_index)
        with torch.no_grad():
            f1, f2 = self.plan.cached_features()
            return entries(f1, f2, rows, cols, self.plan.mode)

    # ------------------------------------------------------------------ slicing
    def _sample_index(self, index: Any, n: int) -> slice | Tensor | None:
        """The sample subset that an operator row/column index selects, or None if it cuts samples."""
        k = self.plan.k if self.plan.mode == "full" else 1
        if isinstance(index, slice):
            start, stop, step = index.indices(n * k)
            if step == 1 and start % k == 0 and stop % k == 0:
                return slice(start // k, stop // k)
            return None
        if isinstance(index, Tensor) and index.dim() == 1 and index.numel() % k == 0:
            if k == 1:
                return index
            first = index[::k]
            expected = first[:, None] + torch.arange(k, device=index.device)
            if bool((first % k == 0).all()) and torch.equal(index.view(-1, k), expected):
                return first // k
        return None

    def _getitem(self, row_index: Any, col_index: Any, *batch_indices: Any) -> LinearOperator:
        n1, n2 = self.plan.side1.x.shape[0], self.plan.side2.x.shape[0]
        rows, cols = self._sample_index(row_index, n1), self._sample_index(col_index, n2)
        if batch_indices or rows is None or cols is None:
            return super()._getitem(row_index, col_index, *batch_indices)
        plan = self.plan.subset(rows, cols)
        return NTKOperator(plan.side1.x, plan.side2.x, plan=plan)


def empirical_ntk(
    model: nn.Module,
    x1: Tensor,
    x2: Tensor | None = None,
    *,
    mode: str = "full",
    backend: str = "auto",
) -> NTKOperator:
    r"""The empirical neural tangent kernel of ``model`` as a lazy ``LinearOperator``.

    .. math::

        \Theta_{oo'}(x, x') = \sum_{p \,\in\, \text{trainable}} \frac{\partial f_o(x)}{\partial \theta_p}
        \frac{\partial f_{o'}(x')}{\partial \theta_p}
        = \sum_{\text{layers } l} \langle \tilde a_l(x), \tilde a_l(x')\rangle\,
          \langle g_{l,o}(x), g_{l,o'}(x')\rangle

    for dense layers (input activations :math:`\tilde a_l`, with a 1 appended for a trainable bias;
    output cotangents :math:`g_{l,o} = \partial f_o / \partial z_l`); parameters partition by
    layer, so there are no cross-layer terms. ``nn.Linear`` on ``(batch, tokens, features)`` and
    every other module with trainable parameters (conv, norms, ...) contribute explicit per-sample
    gradients (the latter with a :class:`~lazykern.ntk.NTKFallbackWarning`).

    Args:
        model: the network; it maps ``(batch, *sample_shape)`` to ``(batch, ...)`` outputs,
            flattened to ``k`` per sample. Only parameters with ``requires_grad`` count. It is
            left unchanged (hooks removed, modes and flags untouched), also when this raises.
        x1: ``(N1, *sample_shape)`` inputs (rows).
        x2: ``(N2, *sample_shape)`` inputs (columns); ``None`` means ``x1`` (features shared).
        mode: ``"full"``: shape ``(N1 k, N2 k)``, row ``i k + o``; ``"trace"``: ``(N1, N2)``,
            :math:`\sum_o \Theta_{oo}`.
        backend: ``"keops"`` (symbolic reduction over features), ``"dense"`` (tiled BLAS),
            ``"linearized"`` (:math:`J (J^\top v)` through the network, for products) or
            ``"auto"`` (:func:`choose_backend`, per product).

    Returns:
        :class:`NTKOperator`, usable with ``@``, ``.diagonal()``, ``.to_dense()``, row/column
        slicing by whole samples, and ``linear_operator``/GPyTorch solves.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).double()
        >>> x = torch.randn(10, 4, dtype=torch.float64)
        >>> K = empirical_ntk(net, x, mode="trace")
        >>> K.shape, K.diagonal().shape
        (torch.Size([10, 10]), torch.Size([10]))
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    feat.check_network(model)
    check_floating_matrix("x1", x1)
    x1 = x1.detach()
    if x2 is not None:
        check_floating_matrix("x2", x2)
        if x2.dtype != x1.dtype:
            raise TypeError(f"x1 and x2 must have the same dtype, got {x1.dtype} and {x2.dtype}")
        if x2.shape[1:] != x1.shape[1:]:
            raise ValueError(
                f"x1 and x2 must have the same sample shape, got {tuple(x1.shape[1:])} and {tuple(x2.shape[1:])}"
            )
        x2 = x2.detach()
    total = x1.shape[0] + (0 if x2 is None else x2.shape[0])
    info = feat.inspect_network(model, x1, total)
    side1 = _Side(x1)
    side2 = side1 if x2 is None else _Side(x2)
    plan = _Plan(model, info, mode, backend, side1, side2)
    return NTKOperator(side1.x, side2.x, plan=plan)
