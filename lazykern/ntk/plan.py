r"""What an empirical NTK will compute, per layer, before computing it; and the cost rules.

**Form of a layer** (:func:`choose_form`). A piece that can be evaluated both ways (dense and
token-wise linear maps, convolutions, attention projections, embeddings) takes the form with the
smaller predicted work for the whole kernel block,

.. math::

    W(\text{form}) = (N_1 + N_2)\, w_\text{feature}(\text{form}) + N_1 N_2\, w_\text{pair}(\text{form}),

(multiply-adds, :class:`~lazykern.ntk.rules.Piece`) among the forms whose features for both sides fit
:class:`lazykern.settings.max_dense_bytes` (if none fits: the smaller features). Both forms run on
the same matrix-product engine, so multiply-adds compare like with like;
``benchmarks/ntk.py --conv-rule`` measures both forms of single convolutions to check where the
rule switches against where the measured times cross (``docs/ntk.rst``).

**Backend of a product** (:func:`choose_backend`, ``backend="auto"``): the smallest predicted time,
with the throughputs measured on the device (:mod:`lazykern.ntk.throughput`).

**Dense blocks in sample tiles** (:func:`dense_blocks`). Explicit features are per-layer per-sample
gradients: held for every sample at once they are the whole per-sample Jacobian. A dense block
whose features would exceed a quarter of the block itself (:data:`TILE_MEMORY_SHARE`; at least one
extraction batch, and never more than :class:`lazykern.settings.max_dense_bytes`) is formed in
``B x B`` sample tiles that hold one row block's and one column block's features at a time, the
column blocks extracted again for every row block. Unless ``max_dense_bytes`` demands them, tiles
are used only where that repeated extraction adds at most :data:`TILE_EXTRA_WORK` of the block's
time (:func:`tiles_pay_off`, from the first row block's extraction, timed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch
from torch import Tensor, nn

from ..operators.dense_cache import DENSE_CACHE
from ..validation import check_samples
from . import features as feat
from .features import batch_bytes
from .rules import FORMS, Piece
from .throughput import measured_rates

__all__ = [
    "BACKENDS", "MODES", "NTKPlan", "apply_forms", "build", "choose_backend", "choose_form", "dense_blocks",
    "tiles_pay_off", "KEOPS_CANDIDATE_SECONDS",
]

#: The kernel's modes: ``"full"`` (every output pair) and ``"trace"`` (the sum over outputs).
MODES = ("full", "trace")
#: How an NTK operator forms its products (:func:`choose_backend`).
BACKENDS = ("auto", "keops", "dense", "linearized")

#: ``backend="auto"`` measures and considers KeOps only for products whose pairwise part is
#: predicted to take longer than this on the torch engine: a KeOps reduction costs a launch of
#: milliseconds (and, the first time on a machine, a compilation of tens of seconds).
KEOPS_CANDIDATE_SECONDS = 0.1

_CPU = torch.device("cpu")

#: Features a dense block may hold at once, as a share of the block's own bytes.
TILE_MEMORY_SHARE = 0.25
#: Extra feature extraction that sample tiles may add, as a share of the block's predicted work.
TILE_EXTRA_WORK = 0.1


def choose_form(piece: Piece, mode: str, n1: int, n2: int, itemsize: int, shared: bool = False,
                device: torch.device | None = None) -> str:
    """The form with the least predicted work among those whose features fit the dense budget of
    ``device`` (default the CPU; :meth:`lazykern.operators.dense_cache.DenseCache.budget`);
    ``shared``: both sides are the same samples, whose features are formed once."""
    if len(piece.forms) == 1:
        return piece.forms[0]
    samples = n1 if shared else n1 + n2
    work = {f: samples * piece.feature_macs(f) + n1 * n2 * piece.pair_macs(mode, f) for f in piece.forms}
    memory = {f: samples * piece.feature_numel(f) * itemsize for f in piece.forms}
    budget = DENSE_CACHE.budget(_CPU if device is None else device)
    fitting = [f for f in piece.forms if memory[f] <= budget]
    if not fitting:
        return min(piece.forms, key=memory.__getitem__)
    return min(fitting, key=work.__getitem__)


def apply_forms(
    pieces: list[Piece], forms: str | Mapping[str, str] | None, mode: str, n1: int, n2: int, itemsize: int, shared: bool,
    device: torch.device | None = None,
) -> None:
    """Set each piece's form: the override in ``forms`` (one form for every piece that has it, or a
    mapping from layer or piece names), else :func:`choose_form` (on ``device``)."""
    if isinstance(forms, str) and forms not in FORMS:
        raise ValueError(f"forms must be one of {FORMS}, a mapping of layer names to them, or None; got {forms!r}")
    overrides: dict[str, str] = {}
    if isinstance(forms, Mapping):
        names = {p.name for p in pieces} | {p.layer for p in pieces}
        for name, form in forms.items():
            if name not in names:
                raise ValueError(f"forms names {name!r}, which is not a layer of the NTK; layers: {sorted(names)}")
            if form not in FORMS:
                raise ValueError(f"forms[{name!r}] must be one of {FORMS}, got {form!r}")
        overrides = dict(forms)
    elif forms is not None and not isinstance(forms, str):
        raise TypeError(f"forms must be a str, a mapping or None, got {type(forms).__name__}")
    for p in pieces:
        wanted = overrides.get(p.name, overrides.get(p.layer)) if overrides else forms
        if wanted is None or (isinstance(forms, str) and wanted not in p.forms):
            p.form = choose_form(p, mode, n1, n2, itemsize, shared, device)
        elif wanted not in p.forms:
            raise ValueError(f"layer {p.name!r} ({p.module}) has forms {p.forms}, not {wanted!r}")
        else:
            p.form = wanted


@dataclass
class NTKPlan:
    r"""Per layer, the rule and form an NTK uses, its feature size and predicted work.

    Returned by :func:`~lazykern.ntk.empirical_ntk` with ``plan=True`` (before anything is computed)
    and held by every :class:`~lazykern.ntk.NTKOperator` as ``.plan``. ``str(plan)`` is a table.

    Attributes:
        mode: ``"full"`` or ``"trace"``.
        n1, n2: samples on each side.
        outputs: :math:`k`, outputs per sample.
        pieces: one :class:`~lazykern.ntk.rules.Piece` per parameter block (``name``, ``rule``,
            ``form``, ``forms``, ``tokens``, ``feature_numel()``, ``pair_macs(mode)``).
        forward_macs: predicted multiply-adds of one forward pass, per sample.
        dtype, device: the network's (the device's dense budget bounds the features held at once).
    """

    mode: str
    n1: int
    n2: int
    outputs: int
    pieces: list[Piece] = field(default_factory=list)
    dtype: torch.dtype = torch.float64
    device: torch.device = field(default_factory=lambda: _CPU)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def forward_macs(self) -> int:
        return sum(p.forward_macs for p in self.pieces)

    @property
    def extraction_macs(self) -> int:
        """Predicted multiply-adds per sample of one forward, one backward per output, and forming the features."""
        return (1 + self.outputs) * self.forward_macs + sum(p.feature_macs() for p in self.pieces)

    def feature_bytes(self, samples: int) -> int:
        return samples * sum(p.feature_numel() for p in self.pieces) * self.itemsize

    def kernel_macs(self) -> float:
        """Predicted multiply-adds of the whole block (features and pairs)."""
        n1, n2 = self.n1, self.n2
        return (n1 + n2) * self.extraction_macs + n1 * n2 * sum(p.pair_macs(self.mode) for p in self.pieces)

    def rows(self) -> list[dict]:
        """One dict per piece: what the table shows."""
        out = []
        for p in self.pieces:
            out.append(
                {
                    "layer": p.name,
                    "module": p.module,
                    "rule": p.rule,
                    "form": p.form,
                    "tokens": p.tokens,
                    "feature_numel": p.feature_numel(),
                    "pair_macs": p.pair_macs(self.mode),
                    "predicted_macs": (self.n1 + self.n2) * p.feature_macs() + self.n1 * self.n2 * p.pair_macs(self.mode),
                }
            )
        return out

    def __str__(self) -> str:
        head = ("layer", "module", "rule", "form", "tokens", "features/sample", "MACs/pair", "predicted MACs")
        body = [
            (r["layer"], r["module"], r["rule"], r["form"], str(r["tokens"]), str(r["feature_numel"]),
             f"{r['pair_macs']:.3g}", f"{r['predicted_macs']:.3g}")
            for r in self.rows()
        ]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        lines = [
            f"empirical NTK plan: mode={self.mode}, N1={self.n1}, N2={self.n2}, k={self.outputs}, "
            f"feature extraction {self.extraction_macs:.3g} MACs/sample, "
            f"features {self.feature_bytes(self.n1 + self.n2) / 2**20:.1f} MiB, whole block {self.kernel_macs():.3g} MACs"
        ]
        for row in (head, *body):
            lines.append("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))
        return "\n".join(lines)


def choose_backend(plan: NTKPlan, n1: int, n2: int, num_rhs: int, features_cached: bool, device: torch.device,
                   shared: bool = False) -> str:
    r"""The backend ``backend="auto"`` uses for one product with ``num_rhs`` columns.

    Predicted seconds, with :math:`R` the throughputs measured on ``device``
    (:func:`~lazykern.ntk.throughput.measured_rates`):

    .. math::

        t_\text{dense} = \frac{(N_1 + N_2)\, w_\text{extract}}{R_\text{network}} + \frac{W(C)}{R_\text{dense}},
        \qquad
        t_\text{keops} = \frac{(N_1 + N_2)\, w_\text{extract}}{R_\text{network}}
            + \frac{W_\text{pairwise}(C)}{R_\text{keops}} + \frac{W_\text{low rank}(C)}{R_\text{dense}},

        t_\text{linearized} = \frac{\big(4 (N_1 + N_2)\, w_\text{forward} + 6 P\big)\, C\, (k \text{ in trace mode})}{R_\text{network}},

    the extraction term only when the features are not cached. The feature backends are
    candidates only when the features of both sides fit the dense budget of ``device``
    (:meth:`lazykern.operators.dense_cache.DenseCache.budget`),
    KeOps only when the pairwise part would take more than :data:`~lazykern.ntk.plan.KEOPS_CANDIDATE_SECONDS` on the
    torch engine.
    """
    mode = plan.mode
    samples = n1 if shared else n1 + n2
    columns = num_rhs * (plan.outputs if mode == "trace" else 1)
    times: dict[str, float] = {}
    fits = features_cached or plan.feature_bytes(samples) <= DENSE_CACHE.budget(device)
    dense = sum(p.matmul_macs(mode, n1, n2, num_rhs) for p in plan.pieces)
    rates = measured_rates(device, plan.dtype, keops=False)
    # per column: a pull-back and a push-forward through the network, each filling a gradient buffer per parameter
    params = sum(p.params for p in plan.pieces)
    times["linearized"] = (4 * (n1 + n2) * plan.forward_macs + 6 * params) * columns / rates.network
    if fits:
        extraction = 0.0 if features_cached else samples * plan.extraction_macs / rates.network
        times["dense"] = extraction + dense / rates.dense
        pairwise = sum(p.matmul_macs(mode, n1, n2, num_rhs, pairwise=True) for p in plan.pieces if p.form == "implicit")
        # KeOps can only repay its probe (and a reduction's launch) on products that take a while
        if pairwise / rates.dense > KEOPS_CANDIDATE_SECONDS:
            rates = measured_rates(device, plan.dtype, keops=True)
            assert rates.keops is not None  # measured: keops=True
            low_rank = sum(p.matmul_macs(mode, n1, n2, num_rhs) for p in plan.pieces if p.form != "implicit")
            times["keops"] = extraction + pairwise / rates.keops + low_rank / rates.dense
    return min(times, key=times.__getitem__)


def dense_blocks(plan: NTKPlan, n1: int, n2: int, shared: bool) -> tuple[int, bool]:
    """Sample blocks per side for a dense ``(n1, n2)`` block by memory (module docstring), and whether
    the dense budget of the plan's device (:meth:`lazykern.operators.dense_cache.DenseCache.budget`)
    demands them (else :func:`tiles_pay_off` decides).
    1 block holds every feature at once; ``B > 1`` hold one row block's and one column block's."""
    samples = n1 if shared else n1 + n2
    features = plan.feature_bytes(samples)
    k = plan.outputs if plan.mode == "full" else 1
    cap = DENSE_CACHE.budget(plan.device)
    limit = min(cap, max(batch_bytes(), int(TILE_MEMORY_SHARE * n1 * n2 * k * k * plan.itemsize)))
    if features <= limit:
        return 1, False
    # held at once: two of B blocks of one sample set, or one of B blocks of each of two sets
    return min(max(n1, n2), -(-(2 if shared else 1) * features // max(1, limit))), features > cap


def tiles_pay_off(plan: NTKPlan, n1: int, n2: int, shared: bool, blocks: int, block_seconds: float,
                  device: torch.device) -> bool:
    """Whether extracting the column blocks again adds at most :data:`TILE_EXTRA_WORK` of the block's
    time, from the measured extraction time of one sample block and the device's pair rate (the
    extraction is timed rather than predicted: convolution backward passes run far below the rate
    of the small dense probe network)."""
    per_sample = block_seconds / -(-n1 // blocks)
    pairs = n1 * n2 * sum(p.pair_macs(plan.mode) for p in plan.pieces) / measured_rates(device, plan.dtype, keops=False).dense
    pairs /= 2 if shared else 1  # the mirrored half is copied, not computed
    seconds = (n1 if shared else n1 + n2) * per_sample + pairs
    extra = (blocks - 1) * (n1 / 2 if shared else n2) * per_sample  # column blocks extracted again
    return extra <= TILE_EXTRA_WORK * seconds


def build(
    model: nn.Module,
    x1: Tensor,
    x2: Tensor | None,
    *,
    mode: str,
    backend: str,
    forms: str | Mapping[str, str] | None,
    sample_ndim: int,
) -> tuple[feat.Network, NTKPlan, dict[str, Tensor]]:
    """Validate, probe the network and plan the per-layer forms (nothing of the kernel is computed)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    feat.check_network(model)
    check_samples("x1", x1, min_dim=sample_ndim + 1)
    if x2 is not None:
        check_samples("x2", x2, min_dim=sample_ndim + 1)
        if x2.dtype != x1.dtype:
            raise TypeError(f"x1 and x2 must have the same dtype, got {x1.dtype} and {x2.dtype}")
        if x2.shape[x2.dim() - sample_ndim :] != x1.shape[x1.dim() - sample_ndim :]:
            raise ValueError(
                f"x1 and x2 must have the same sample shape, got {tuple(x1.shape[x1.dim() - sample_ndim:])} "
                f"and {tuple(x2.shape[x2.dim() - sample_ndim:])}"
            )
        if x2.device != x1.device:
            raise ValueError(f"x1 and x2 must be on the same device, got {x1.device} and {x2.device}")
    tensors = feat.model_tensors(model)
    samples = x1.reshape(-1, *x1.shape[x1.dim() - sample_ndim :])
    network = feat.inspect_network(model, samples.detach(), tensors)
    n1 = x1.shape[x1.dim() - sample_ndim - 1]
    n2 = n1 if x2 is None else x2.shape[x2.dim() - sample_ndim - 1]
    plan = NTKPlan(mode, n1, n2, network.num_outputs, network.pieces, network.dtype, x1.device)
    apply_forms(plan.pieces, forms, mode, n1, n2, plan.itemsize, shared=x2 is None, device=plan.device)
    return network, plan, tensors
