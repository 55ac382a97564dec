r"""The empirical NTK as a ``linear_operator`` ``LinearOperator`` and :func:`empirical_ntk`."""

from __future__ import annotations

import itertools
import math
import time
from typing import Any, Literal, Mapping, cast, overload

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor, nn

from ..operators.dense_cache import DENSE_CACHE
from . import features as feat
from . import products
from .linearized import linearized_matmul
from .plan import BACKENDS, MODES, NTKPlan, build, choose_backend, dense_blocks, tiles_pay_off
from .stream import write_ntk
from .terms import Term, index_terms, terms_bytes
from .throughput import synchronize

__all__ = ["NTKOperator", "empirical_ntk", "MODES", "BACKENDS"]


class _FeatureCache:
    """The features of the inputs that the operators derived from one :func:`empirical_ntk` call
    have met, for repeated products (CG), kept in the dense cache
    (:data:`~lazykern.operators.dense_cache.DENSE_CACHE`, this object its owner: the features die
    with the operators) under its one budget per device.

    Per input tensor (held weakly: a new tensor at the same address never matches), its version,
    the batch element, and the network's tensors by identity and version (so ``.double()`` copies
    and optimizer steps miss). Only features formed without a graph are kept. A copy (``pickle``,
    ``deepcopy``) is a new owner and starts empty.

    Example:
        >>> import torch
        >>> from lazykern.ntk.terms import Explicit
        >>> cache, x, w = _FeatureCache(), torch.randn(3, 2), torch.randn(4)
        >>> cache.put(x, (), (w,), [Explicit(torch.ones(3, 1, 4))])
        >>> cache.get(x, (), (w,))[0].e.shape, cache.get(x, (), (w.clone(),)), len(cache)
        (torch.Size([3, 1, 4]), None, 1)
    """

    def get(self, x: Tensor, item: tuple, tensors: tuple[Tensor, ...]) -> list[Term] | None:
        """The features of batch element ``item`` of ``x`` under the network tensors ``tensors``."""
        return DENSE_CACHE.lookup(self, (x, *tensors), None, slot=(id(x), id(tensors[0]), item))

    def __len__(self) -> int:
        """How many feature sets are kept."""
        return DENSE_CACHE.count(self)

    def put(self, x: Tensor, item: tuple, tensors: tuple[Tensor, ...], terms: list[Term]) -> None:
        """Keep ``terms`` as the features of batch element ``item`` of ``x`` (if they fit the budget)."""
        DENSE_CACHE.store(self, (x, *tensors), None, terms, slot=(id(x), id(tensors[0]), item),
                          nbytes=terms_bytes(terms), device=x.device)


class NTKOperator(LinearOperator):
    r"""The empirical NTK :math:`\Theta(x^{(1)}, x^{(2)})` of a network, never stored.

    Build it with :func:`empirical_ntk` (or through :class:`~lazykern.ntk.NTKKernel`). Full mode:
    shape ``(*batch, N1 k, N2 k)``, row ``i k + o``; trace mode: ``(*batch, N1, N2)``. It is
    represented by the inputs and by the network's floating parameters and buffers
    (``representation()``), so dtype and device conversions, batch operations (``unsqueeze``,
    ``expand``, ``permute``, indexing) and gradients with respect to any of them behave as for any
    ``linear_operator`` operator; the network itself only supplies the computation. Products run on
    the backend chosen at construction (``"auto"``: per product, by
    :func:`~lazykern.ntk.choose_backend`); the diagonal, gathered entries and
    :meth:`to_dense` come from per-layer features, formed in sample batches and kept only when the
    product backend already keeps them.

    Args:
        x1: ``(*batch, N1, *sample_shape)`` row inputs.
        x2: ``(*batch, N2, *sample_shape)`` column inputs (batch shapes broadcast).
        *tensors: the network's floating parameters and buffers, in the order of ``names``.
        network: what :func:`~lazykern.ntk.features.inspect_network` learned.
        plan: the per-layer forms (:class:`~lazykern.ntk.NTKPlan`).
        names: qualified names of ``tensors``.
        backend: ``"auto"``, ``"keops"``, ``"dense"`` or ``"linearized"``.
        sample_ndim: ``len(sample_shape)``.
        cache (``_FeatureCache``): the feature cache shared by the operators derived from this one.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
        >>> K = empirical_ntk(net, torch.randn(5, 3, dtype=torch.float64))
        >>> (K @ torch.ones(10, dtype=torch.float64)).shape
        torch.Size([10])
    """

    def __init__(
        self,
        x1: Tensor,
        x2: Tensor,
        *tensors: Tensor,
        network: feat.Network,
        plan: NTKPlan,
        names: tuple[str, ...],
        backend: str,
        sample_ndim: int,
        cache: _FeatureCache,
    ) -> None:
        super().__init__(x1, x2, *tensors, network=network, plan=plan, names=names, backend=backend,
                         sample_ndim=sample_ndim, cache=cache)
        self.network, self.plan, self.names, self.backend = network, plan, names, backend
        self.sample_ndim, self.cache = sample_ndim, cache

    # ------------------------------------------------------------------ representation
    @property
    def x1(self) -> Tensor:
        return self._args[0]

    @property
    def x2(self) -> Tensor:
        return self._args[1]

    @property
    def tensors(self) -> dict[str, Tensor]:
        return dict(zip(self.names, self._args[2:]))

    @property
    def dtype(self) -> torch.dtype:
        return self._args[2].dtype

    @property
    def device(self) -> torch.device:
        return self.x1.device

    def _new(self, x1: Tensor, x2: Tensor, tensors: tuple[Tensor, ...] | None = None) -> "NTKOperator":
        return NTKOperator(x1, x2, *(self._args[2:] if tensors is None else tensors), **self._kwargs)

    def _batch(self, x: Tensor) -> torch.Size:
        return x.shape[: x.dim() - 1 - self.sample_ndim]

    def _full_batch(self) -> tuple[Tensor, Tensor]:
        """Both inputs expanded to the operator's batch shape (views)."""
        batch = self.batch_shape
        x1, x2 = (x.expand(*batch, *x.shape[len(self._batch(x)) :]) for x in (self.x1, self.x2))
        return x1, x2

    @property
    def _k(self) -> int:
        return self.plan.outputs if self.plan.mode == "full" else 1

    def _size(self) -> torch.Size:
        batch = torch.broadcast_shapes(self._batch(self.x1), self._batch(self.x2))
        n1 = self.x1.shape[len(self._batch(self.x1))]
        n2 = self.x2.shape[len(self._batch(self.x2))]
        return torch.Size((*batch, n1 * self._k, n2 * self._k))

    @property
    def num_outputs_per_input(self) -> tuple[int, int]:
        """Rows and columns per sample (``k`` in full mode, 1 in trace mode), as in ``KernelLinearOperator``."""
        return self._k, self._k

    def _transpose_nonbatch(self) -> "NTKOperator":
        return self._new(self.x2, self.x1)

    def _expand_batch(self, batch_shape: torch.Size) -> "NTKOperator":
        x1, x2 = (x.expand(*batch_shape, *x.shape[len(self._batch(x)) :]) for x in (self.x1, self.x2))
        return self._new(x1, x2)

    def _unsqueeze_batch(self, dim: int) -> "NTKOperator":
        x1, x2 = (x.unsqueeze(dim) for x in self._full_batch())
        return self._new(x1, x2)

    def _permute_batch(self, *dims: int) -> "NTKOperator":
        x1, x2 = (x.permute(*dims, *range(len(dims), x.dim())) for x in self._full_batch())
        return self._new(x1, x2)

    # ------------------------------------------------------------------ features
    def _differentiable(self) -> bool:
        """Whether results must carry a graph: grad mode on and some representation tensor requires grad."""
        return torch.is_grad_enabled() and any(t.requires_grad for t in self._args)

    def _items(self) -> list[tuple[tuple, Tensor, Tensor]]:
        """Per batch element: its index and the two sample sets."""
        x1, x2 = self._full_batch()
        return [(b, x1[b], x2[b]) for b in itertools.product(*(range(s) for s in self.batch_shape))]

    def _shared(self, x1: Tensor, x2: Tensor) -> bool:
        """Whether both sides are the same samples, whose features are formed once: the same
        tensor, or (when no gradient is being taken) the same memory viewed the same way."""
        if self.x1 is self.x2:
            return True
        same = x1.shape == x2.shape and x1.data_ptr() == x2.data_ptr() and x1.stride() == x2.stride()
        return same and not self._differentiable()

    def _cached(self, root: Tensor, item: tuple) -> list[Term] | None:
        return self.cache.get(root, item, self._args[2:])

    def _features(self, x: Tensor, root: Tensor, item: tuple, *, keep: bool, differentiable: bool) -> list[Term]:
        """Features of the samples ``x`` (batch element ``item`` of ``root``); cached when ``keep``."""
        if not differentiable:
            cached = self._cached(root, item)
            if cached is not None:
                return cached
        terms = feat.extract(self.network, self.tensors, x, differentiable=differentiable)
        if keep and not differentiable:
            self.cache.put(root, item, self._args[2:], terms)
        return terms

    def _both(self, item: tuple, x1: Tensor, x2: Tensor, *, keep: bool, differentiable: bool):
        f1 = self._features(x1, self.x1, item, keep=keep, differentiable=differentiable)
        if self._shared(x1, x2):
            return f1, f1
        return f1, self._features(x2, self.x2, item, keep=keep, differentiable=differentiable)

    def _choose(self, x1: Tensor, x2: Tensor, item: tuple, columns: int) -> str:
        if self.backend != "auto":
            return self.backend
        shared = self._shared(x1, x2)
        cached = self._cached(self.x1, item) is not None and (shared or self._cached(self.x2, item) is not None)
        return choose_backend(self.plan, x1.shape[0], x2.shape[0], columns, cached, self.device, shared)

    # ------------------------------------------------------------------ products
    def _matmul(self, rhs: Tensor) -> Tensor:
        vector = rhs.dim() == 1
        rhs = rhs.unsqueeze(-1) if vector else rhs
        batch = torch.broadcast_shapes(self.batch_shape, rhs.shape[:-2])
        nd, offset = len(batch), len(batch) - len(self.batch_shape)
        rhs = rhs.expand(*batch, *rhs.shape[-2:])
        # batch dimensions along which the operator is constant become extra columns
        op_shape = (1,) * offset + tuple(self.batch_shape)
        keep = [d for d in range(nd) if op_shape[d] != 1]
        fold = [d for d in range(nd) if op_shape[d] == 1]
        kshape, fshape = [batch[d] for d in keep], [batch[d] for d in fold]
        n2, c = rhs.shape[-2:]
        r = rhs.permute(*keep, *fold, nd, nd + 1).reshape(*kshape, math.prod(fshape), n2, c)
        r = r.movedim(-3, -2).reshape(*kshape, n2, -1)
        differentiable = self._differentiable()
        outs = []
        for item, x1, x2 in self._items():
            v = r[tuple(item[d - offset] for d in keep)]
            backend = self._choose(x1, x2, item, v.shape[-1])
            if backend == "linearized":
                out = linearized_matmul(self.network, self.tensors, x1, x2, v, self.plan.mode, differentiable)
            else:
                f1, f2 = self._both(item, x1, x2, keep=True, differentiable=differentiable)
                out = products.matmul(f1, f2, v, self.plan.mode, backend)
            outs.append(out)
        rows = outs[0].shape[0]
        out = torch.stack(outs).reshape(*self.batch_shape, rows, *fshape, c)
        out = out.reshape(*kshape, rows, *fshape, c)
        current = [*keep, "rows", *fold, "cols"]
        out = out.permute(*(current.index(a) for a in [*range(nd), "rows", "cols"]))
        return out.squeeze(-1) if vector else out

    def to_dense(self) -> Tensor:
        differentiable = self._differentiable()
        blocks = [self._dense_item(item, x1, x2, differentiable) for item, x1, x2 in self._items()]
        return blocks[0] if not self.batch_shape else torch.stack(blocks).reshape(self.shape)

    def _dense_item(self, item: tuple, x1: Tensor, x2: Tensor, differentiable: bool) -> Tensor:
        """One batch element's block: from cached features, or in sample tiles
        (:func:`~lazykern.ntk.plan.dense_blocks`) that hold one row block's and one column block's
        features at a time; when both sides are the same samples, only tiles on and above the
        diagonal are formed, and mirrored."""
        mode, k = self.plan.mode, self._k
        shared = self._shared(x1, x2)
        n1, n2 = x1.shape[0], x2.shape[0]
        cached1, cached2 = self._cached(self.x1, item), self._cached(self.x2, item)
        cached = not differentiable and cached1 is not None and (shared or cached2 is not None)
        blocks, forced = (1, False) if cached else dense_blocks(self.plan, n1, n2, shared)
        first = None
        if blocks > 1:
            row_blocks = products.split(n1, blocks)
            synchronize(self.device)
            start = time.perf_counter()
            first = feat.extract(self.network, self.tensors, x1[row_blocks[0]], differentiable=differentiable)
            synchronize(self.device)
            if not forced and not tiles_pay_off(self.plan, n1, n2, shared, blocks, time.perf_counter() - start,
                                                self.device):
                blocks, first = 1, None
        if blocks == 1:
            f1, f2 = self._both(item, x1, x2, keep=False, differentiable=differentiable)
            return products.dense(f1, f2, mode)
        col_blocks = row_blocks if shared else products.split(n2, blocks)
        out = torch.zeros(n1 * k, n2 * k, dtype=self.dtype, device=self.device)
        for i, rows in enumerate(row_blocks):
            # the first row block's features were extracted above (and are dropped after it)
            f1 = first if first is not None else feat.extract(self.network, self.tensors, x1[rows], differentiable=differentiable)
            first = None
            for cols in col_blocks[i if shared else 0 :]:
                same = shared and cols == rows
                f2 = f1 if same else feat.extract(self.network, self.tensors, x2[cols], differentiable=differentiable)
                tile = products.dense(f1, f2, mode)
                r, c = slice(rows.start * k, rows.stop * k), slice(cols.start * k, cols.stop * k)
                out[r, c] = tile
                if shared and not same:
                    out[c, r] = tile.T
                del f2, tile  # before the next column block is extracted
        return out

    def _diagonal(self) -> Tensor:
        if self.x1.shape[len(self._batch(self.x1))] != self.x2.shape[len(self._batch(self.x2))]:
            raise ValueError(f"the diagonal needs a square operator, got shape {tuple(self.shape)}")
        differentiable = self._differentiable()
        mode = self.plan.mode
        diags = []
        for item, x1, x2 in self._items():
            shared = self._shared(x1, x2)
            c1, c2 = self._cached(self.x1, item), self._cached(self.x2, item)
            other = c1 if shared else c2
            if not differentiable and c1 is not None and other is not None:
                diags.append(products.diagonal(c1, other, mode))
                continue
            # stream sample batches: the diagonal needs no stored features, only O(N) output
            parts: list[Tensor] = []

            def consume(rows: slice, f1: list[Term], x2: Tensor = x2, shared: bool = shared) -> None:
                f2 = f1 if shared else feat.extract(self.network, self.tensors, x2[rows], differentiable=differentiable)
                parts.append(products.diagonal(f1, f2, mode))

            feat.stream(self.network, self.tensors, x1, consume, differentiable=differentiable)
            diags.append(torch.cat(parts))
        return torch.stack(diags).reshape(*self.batch_shape, -1)

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        shape = torch.broadcast_shapes(row_index.shape, col_index.shape, *(b.shape for b in batch_indices))
        rows, cols = (i.expand(shape).reshape(-1) for i in (row_index, col_index))
        flat = torch.zeros_like(rows)
        for b, size in zip(batch_indices, self.batch_shape):
            flat = flat * size + b.expand(shape).reshape(-1)
        differentiable = self._differentiable()
        out = torch.zeros(rows.shape, dtype=self.dtype, device=self.device)
        items = self._items()
        for value in torch.unique(flat).tolist():
            where = (flat == value).nonzero().squeeze(-1)
            item, x1, x2 = items[value]
            r, c = rows[where], cols[where]
            f1 = self._subset_features(x1, self.x1, item, r // self._k, differentiable)
            f2 = self._subset_features(x2, self.x2, item, c // self._k, differentiable)
            vals = products.entries(f1[0], f2[0], f1[1] * self._k + r % self._k, f2[1] * self._k + c % self._k,
                                    self.plan.mode)
            out = out.index_put((where,), vals)
        return out.reshape(shape)

    def _subset_features(self, x: Tensor, root: Tensor, item: tuple, samples: Tensor, differentiable: bool):
        """Features of only the samples an index touches, and each position's row among them."""
        cached = None if differentiable else self._cached(root, item)
        if cached is not None:
            return cached, samples
        unique, inverse = torch.unique(samples, return_inverse=True)
        return feat.extract(self.network, self.tensors, x[unique], differentiable=differentiable), inverse

    # ------------------------------------------------------------------ slicing
    def _sample_index(self, index: Any, n: int) -> slice | Tensor | None:
        """The sample subset that an operator row/column index selects, or None if it cuts samples."""
        k = self._k
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
        x1, x2 = self._full_batch()
        if batch_indices:
            x1, x2 = x1[batch_indices], x2[batch_indices]
        noop = all(isinstance(i, slice) and i == slice(None, None, None) for i in (row_index, col_index))
        if noop:
            return self._new(x1, x2) if batch_indices else self
        tensor_batch = any(isinstance(b, Tensor) for b in batch_indices)
        n1, n2 = self.size(-2) // self._k, self.size(-1) // self._k
        rows, cols = self._sample_index(row_index, n1), self._sample_index(col_index, n2)
        if tensor_batch or rows is None or cols is None:
            # indices that cut through a sample's outputs, or batch indices that pair with them
            return super()._getitem(row_index, col_index, *batch_indices)
        axis1, axis2 = x1.dim() - 1 - self.sample_ndim, x2.dim() - 1 - self.sample_ndim
        new1, new2 = (x[(slice(None),) * axis + (sel,)] for x, axis, sel in ((x1, axis1, rows), (x2, axis2, cols)))
        same = type(rows) is type(cols) and (  # then a tensor cols where rows is one
            rows == cols if isinstance(rows, slice) else torch.equal(rows, cast(Tensor, cols)))
        if self.x1 is self.x2 and same:
            new2 = new1
        op = self._new(new1, new2)
        if not batch_indices and not op.batch_shape:
            for root, new, sel in ((self.x1, new1, rows), (self.x2, new2, cols)):
                cached = self._cached(root, ())
                if cached is not None:
                    self.cache.put(new, (), self._args[2:], index_terms(cached, sel))
        return op


def empirical_ntk(
    model: nn.Module,
    x1: Tensor,
    x2: Tensor | None = None,
    *,
    mode: str = "full",
    backend: str = "auto",
    forms: str | Mapping[str, str] | None = None,
    plan: bool = False,
    out: Any = None,
    block_size: int | None = None,
    progress: bool = True,
) -> NTKOperator | NTKPlan | Any:
    r"""The empirical neural tangent kernel of ``model`` as a lazy ``LinearOperator``, or written tile by tile into ``out``.

    .. math::

        \Theta_{oo'}(x, x') = \sum_{p \,\in\, \text{trainable}} \frac{\partial f_o(x)}{\partial \theta_p}
        \frac{\partial f_{o'}(x')}{\partial \theta_p}
        = \sum_{\text{layers } l} \sum_{t, t'} s_l\big(a_{l,t}(x), a_{l,t'}(x')\big)\,
          \big\langle g_{l,o,t}(x), g_{l,o',t'}(x')\big\rangle

    summed over each layer's tokens :math:`t` (positions of a convolution, tokens of a sequence), with :math:`a`
    the layer's input (a 1 appended for a trainable bias), :math:`g_{o} = \partial f_o / \partial z` the
    cotangent at its output and :math:`s` a dot product (an equality of token ids for embeddings); parameters
    partition by layer, so there are no cross-layer terms. Each layer type has a rule (:mod:`lazykern.ntk.rules`):
    ``nn.Linear`` (any token axes), ``nn.Conv1d/2d/3d``, ``nn.LayerNorm``, ``nn.GroupNorm``, ``nn.BatchNorm*``
    (eval mode), ``nn.Embedding``, ``nn.MultiheadAttention``; any other module with trainable parameters costs
    explicit per-sample gradients (with a :class:`~lazykern.ntk.NTKFallbackWarning`). Layers with an implicit
    (pair formula) and an explicit (per-sample gradient) form take the cheaper one for this block
    (:func:`~lazykern.ntk.choose_form`) unless ``forms`` says otherwise.

    Gradients flow to ``x1``, ``x2`` (when they require grad) through every product, block, diagonal and entry.

    Args:
        model: the network; it maps ``(batch, *sample_shape)`` inputs (floating, or integer token ids) to
            ``(batch, ...)`` outputs, flattened to ``k`` per sample. Only parameters with ``requires_grad``
            count. It is left unchanged (hooks removed, modes and flags untouched), also when this raises.
        x1: ``(N1, *sample_shape)`` inputs (rows).
        x2: ``(N2, *sample_shape)`` inputs (columns); ``None`` means ``x1`` (features shared).
        mode: ``"full"``: shape ``(N1 k, N2 k)``, row ``i k + o``; ``"trace"``: ``(N1, N2)``, :math:`\sum_o \Theta_{oo}`.
        backend: ``"keops"`` (symbolic reductions over features: KeOps, or on a GPU where KeOps fails its
            health check lazykern's Triton engine: :func:`lazykern.backend.preferred`), ``"dense"`` (the
            chunked torch engine), ``"linearized"`` (:math:`J (J^\top v)` through the network, for products)
            or ``"auto"`` (per product, from throughputs measured on the device: :func:`~lazykern.ntk.choose_backend`).
        forms: ``None`` (cost rule), ``"implicit"`` or ``"explicit"`` (for every layer that has that form), or
            a mapping from layer names (``"features.0"``, or a piece such as ``"encoder.self_attn[q]"``) to forms.
        plan: if ``True``, return the :class:`~lazykern.ntk.NTKPlan` (per layer: rule, form, feature size,
            predicted work) instead of the operator; nothing of the kernel is computed.
        out: where to write the whole kernel instead of returning the operator (:mod:`lazykern.ntk.stream`):
            a tensor or NumPy array (or memmap) of the kernel's shape and the model's dtype, or a path ending
            in ``.npy`` (created, or continued where an earlier run stopped, with a progress record beside
            it). The kernel is formed in square tiles of ``block_size`` samples, each off-diagonal tile of a
            symmetric kernel once; memory holds the features of two blocks and one tile, whatever N. ``x1``
            and ``x2`` may then also be ``torch.utils.data.Dataset`` or ``DataLoader`` objects, read block by block.
        block_size: samples per tile side with ``out`` (default: the largest whose features and tile fit
            :class:`lazykern.settings.max_dense_bytes`, :func:`lazykern.ntk.stream.block_size`).
        progress: with ``out``, a progress bar over the pairs and a one-line summary on stderr.

    Returns:
        :class:`NTKOperator` (``@``, ``.diagonal()``, ``.to_dense()``, slicing by whole samples, ``linear_operator``/
        GPyTorch solves), the :class:`~lazykern.ntk.NTKPlan`, or, with ``out``, ``out`` filled (for a path: the
        ``.npy`` file opened as a ``numpy.memmap``).

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).double()
        >>> x = torch.randn(10, 4, dtype=torch.float64)
        >>> K = empirical_ntk(net, x, mode="trace")
        >>> K.shape, K.diagonal().shape
        (torch.Size([10, 10]), torch.Size([10]))
        >>> print(empirical_ntk(net, x, plan=True).pieces[0].form)
        implicit
    """
    if out is not None and not plan:
        return write_ntk(model, x1, x2, mode=mode, out=out, forms=forms, block=block_size, progress=progress)
    if block_size is not None:
        raise ValueError("block_size applies with out= only (the lazy operator plans its own blocks)")
    sample_ndim = x1.dim() - 1 if isinstance(x1, Tensor) else 0
    return make_operator(model, x1, x2, mode=mode, backend=backend, forms=forms, sample_ndim=sample_ndim, plan=plan)


@overload
def make_operator(model: nn.Module, x1: Tensor, x2: Tensor | None, *, mode: str, backend: str,
                  forms: str | Mapping[str, str] | None, sample_ndim: int, plan: Literal[False] = False) -> NTKOperator: ...


@overload
def make_operator(model: nn.Module, x1: Tensor, x2: Tensor | None, *, mode: str, backend: str,
                  forms: str | Mapping[str, str] | None, sample_ndim: int, plan: bool) -> NTKOperator | NTKPlan: ...


def make_operator(
    model: nn.Module,
    x1: Tensor,
    x2: Tensor | None,
    *,
    mode: str,
    backend: str,
    forms: str | Mapping[str, str] | None,
    sample_ndim: int,
    plan: bool = False,
) -> NTKOperator | NTKPlan:
    """:func:`empirical_ntk` for inputs ``(*batch, N, *sample_shape)`` with ``len(sample_shape) == sample_ndim``."""
    network, ntk_plan, tensors = build(model, x1, x2, mode=mode, backend=backend, forms=forms, sample_ndim=sample_ndim)
    if plan:
        return ntk_plan
    return NTKOperator(
        x1, x1 if x2 is None else x2, *tensors.values(), network=network, plan=ntk_plan, names=tuple(tensors),
        backend=backend, sample_ndim=sample_ndim, cache=_FeatureCache(),
    )
