r"""NTK rules: one small object per layer type.

A rule knows, for the modules it :meth:`~Rule.matches`:

* what to keep from a forward pass (:meth:`~Rule.capture`): the layer's output :math:`z`, whose
  cotangents :math:`g_o = \partial f_o/\partial z` the extraction computes, and what the features
  need besides (inputs, normalized activations, token ids);
* its *pieces* (:meth:`~Rule.pieces`): one parameter block each, with its token count, widths,
  the forms it can take (``"implicit"``: a pair formula over tokens; ``"explicit"``: a per-sample
  gradient) and the cost model (:class:`Piece`) from which the form is chosen;
* its features (:meth:`~Rule.terms`), as :mod:`lazykern.ntk.terms`.

Rules (first match wins): :class:`LinearRule` (``nn.Linear`` on ``(..., F)``, every leading axis
but the sample axis a token), :class:`ConvRule` (``nn.Conv1d/2d/3d``: stride, padding and padding
modes, dilation, groups), :class:`LayerNormRule`, :class:`GroupNormRule`, :class:`BatchNormRule`
(eval mode), :class:`EmbeddingRule`, :class:`MultiheadAttentionRule`, and :class:`FallbackRule`
(explicit per-sample gradients through ``torch.func``, with a warning) for anything else that
owns trainable parameters.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap

from .terms import Explicit, Implicit, Sparse, Term

__all__ = [
    "FORMS",
    "NTKFallbackWarning",
    "Capture",
    "Piece",
    "Rule",
    "LinearRule",
    "ConvRule",
    "LayerNormRule",
    "GroupNormRule",
    "BatchNormRule",
    "EmbeddingRule",
    "MultiheadAttentionRule",
    "FallbackRule",
    "RULES",
    "rule_for",
    "implicit_matmul_macs",
]

FORMS = ("implicit", "explicit")


class NTKFallbackWarning(UserWarning):
    """A module has no NTK rule and costs explicit per-sample gradients through ``torch.func``."""


@dataclass
class Capture:
    """What a rule keeps from one forward pass: the output ``z`` and the context its features need."""

    label: str
    z: Tensor
    ctx: dict[str, Any] = field(default_factory=dict)


@dataclass
class Piece:
    r"""One parameter block of one layer, its sizes, and its cost model.

    Sizes are per sample: ``tokens`` :math:`T`, per group the input width :math:`F` (a bias column
    included) and output width :math:`H`, ``groups`` :math:`G`, ``params`` :math:`P` (the length of
    the per-sample gradient per output), ``outputs`` :math:`k`. Costs are multiply-adds; with
    :math:`\kappa = k` in trace mode and :math:`k^2` in full mode:

    =============  ==============================================  ====================================
    form           per sample pair (dense kernel)                  per sample (features, beyond passes)
    =============  ==============================================  ====================================
    implicit       trace :math:`G T^2 (F + k H)`;                  0
                   full :math:`G (T^2 F + T^2 k H + T k^2 H)`
    explicit       :math:`\kappa P`                                :math:`T k P` (:math:`\sum_t g_t a_t^\top`)
    =============  ==============================================  ====================================

    (one token: full mode :math:`F + k^2 H`).

    An embedding's explicit form is sparse: :math:`\rho T^2 \kappa H` per pair, with :math:`\rho`
    the fraction of equal token pairs (estimated from the probe samples).
    """

    layer: str
    module: str
    rule: str
    label: str
    kind: str  # "tokens", "embedding", "scale", "fallback"
    forms: tuple[str, ...]
    tokens: int
    width_in: int
    width_out: int
    params: int
    outputs: int
    forward_macs: int
    groups: int = 1
    match_fraction: float = 1.0
    form: str = ""

    @property
    def name(self) -> str:
        return f"{self.layer}[{self.label}]" if self.label else self.layer

    def feature_numel(self, form: str | None = None) -> int:
        form = form or self.form
        k, t = self.outputs, self.tokens
        if form == "implicit" or self.kind == "embedding":
            return self.groups * t * (self.width_in + k * self.width_out)
        return k * self.params

    def feature_macs(self, form: str | None = None) -> int:
        form = form or self.form
        if form == "implicit" or self.kind == "embedding":
            return 0
        if self.kind == "fallback":
            return 2 * self.outputs * self.forward_macs
        return self.tokens * self.outputs * self.params

    def pair_macs(self, mode: str, form: str | None = None) -> float:
        form = form or self.form
        k, t, f, h = self.outputs, self.tokens, self.width_in, self.width_out
        kk = k * k if mode == "full" else k
        t2 = t * t
        if form == "implicit":
            if mode == "trace":
                return self.groups * t2 * (f + k * h)
            # first factor per token pair, then cotangents through it (products.dense)
            return self.groups * (t2 * f + t * kk * h + (t2 * k * h if t > 1 else 0))
        if self.kind == "embedding":
            return self.match_fraction * t2 * kk * self.width_out
        return kk * self.params

    def matmul_macs(self, mode: str, n1: int, n2: int, columns: int, form: str | None = None, pairwise: bool = False) -> float:
        """Multiply-adds of one product with ``columns`` right-hand sides, features given
        (``pairwise``: implicit forms evaluated pairwise, as on KeOps; else the cheaper way)."""
        form = form or self.form
        k, t, c, g = self.outputs, self.tokens, columns, self.groups
        if form == "implicit":
            costs = implicit_matmul_macs(mode, n1, n2, t, self.width_in, self.width_out, k, c, self.kind == "embedding")
            return g * (costs["pairwise"] if pairwise else min(costs.values()))
        if self.kind == "embedding":
            return (n1 + n2) * t * k * self.width_out * c
        return (n1 + n2) * k * self.params * c


def implicit_matmul_macs(
    mode: str, n1: int, n2: int, tokens: int, width_in: int, width_out: int, outputs: int, columns: int, equal: bool = False
) -> dict[str, float]:
    r"""Multiply-adds of one implicit term's product, evaluated pairwise or factored.

    Pairwise: every (sample, token) pair, :math:`N_1 N_2 T^2 (F + k H + C)` (trace) or
    :math:`N_1 N_2 T^2 (F + H C)` (full). Factored: through the layer's weight-gradient space,
    :math:`V \mapsto \sum_{j,t} \tilde a_{jt} \otimes u_{jt}` and back, :math:`(N_1 + N_2) T H F C`
    (times :math:`k` in trace mode); for token equality (embeddings) a scatter and gather,
    :math:`(N_1 + N_2) T k H C`. The first grows with :math:`N_1 N_2`, the second with :math:`N_1 + N_2`.
    """
    t, f, h, k, c = tokens, width_in, width_out, outputs, columns
    if mode == "trace":
        pairwise = n1 * n2 * t * t * (f + k * h + c)
        factored = (n1 + n2) * t * k * h * (1 if equal else f) * c
    else:
        pairwise = n1 * n2 * t * t * (f + h * c) + (n1 + n2) * t * k * h * c
        factored = (n1 + n2) * t * h * c * (k if equal else f + k)
    return {"pairwise": pairwise, "factored": factored}


class Rule:
    """Base of the per-layer rules. Subclasses set :attr:`name` and implement the hooks below.

    Args:
        layer: the module's qualified name in the model.
        module: the module.
        trainable: names (relative to ``module``) of the trainable parameters it covers.
    """

    #: The rule's name, as the plan's ``rule`` column shows it.
    name: ClassVar[str] = ""

    # Each rule narrows ``module`` to the modules it matches, for type checkers only (TYPE_CHECKING: as
    # a class annotation it would also narrow this argument in the API reference).
    def __init__(self, layer: str, module: nn.Module, trainable: set[str]) -> None:
        self.layer, self.module, self.trainable = layer, module, trainable

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        """Whether this rule handles ``module`` (the first rule that matches takes it)."""
        raise NotImplementedError

    def claims(self) -> list[str]:
        """Relative names of child modules whose parameters this rule covers (their forwards never run)."""
        return []

    def capture(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> tuple[list[Capture], Any]:
        """Captures of one forward, and the output to use instead of ``output`` (``None``: keep it)."""
        raise NotImplementedError

    def sample_axis_fixed(self) -> bool:
        """Whether the sample axis must be the first one (convolutions, batch-style norms)."""
        return False

    def pieces(self, captures: list[Capture], axes: list[int], k: int) -> list[Piece]:
        """The layer's parameter blocks with their sizes, from the probe's captures, their sample
        axes ``axes`` and the number of outputs ``k``."""
        raise NotImplementedError

    def terms(
        self, captures: list[Capture], cots: list[Tensor], axes: list[int], pieces: list[Piece], params: dict[str, Tensor]
    ) -> list[list[Term]]:
        """Features of one sample batch, one list of terms per piece. ``cots[i]`` is
        ``(k, *captures[i].z.shape)``; ``params`` maps the relative names of this rule's tensors
        (parameters, trainable or not, and buffers) to the tensors in use."""
        raise NotImplementedError

    def _piece(self, label: str, kind: str, forms: tuple[str, ...], **sizes: Any) -> Piece:
        return Piece(layer=self.layer, module=type(self.module).__name__, rule=self.name, label=label, kind=kind,
                     forms=forms, **sizes)


def _tensor(module: nn.Module, name: str) -> Tensor:
    """The tensor a module currently uses under a dotted name (a plain tensor inside
    :func:`torch.func.functional_call`, where ``get_parameter`` would refuse it)."""
    *path, leaf = name.split(".")
    for part in path:
        module = getattr(module, part)
    return getattr(module, leaf)


def _overrides(module: nn.Module, base: type[nn.Module]) -> bool:
    return isinstance(module, base) and type(module).forward is base.forward


def _tokens(t: Tensor, axis: int, width: int) -> Tensor:
    """``(..., width)`` with the sample axis ``axis`` -> ``(N, T, width)``."""
    t = t.movedim(axis, 0)
    return t.reshape(t.shape[0], -1, width)


def _cot_tokens(g: Tensor, axis: int, width: int) -> Tensor:
    """Cotangents ``(k, ..., width)`` (sample axis ``axis + 1``) -> ``(N, k, T, width)``."""
    g = g.movedim(axis + 1, 1)
    return g.reshape(g.shape[0], g.shape[1], -1, width).transpose(0, 1)


def _augmented(a: Tensor, bias: bool) -> Tensor:
    r""":math:`\tilde a = (a, 1)` when the bias is trainable, else ``a``."""
    return torch.cat([a, a.new_ones(*a.shape[:-1], 1)], dim=-1) if bias else a


def _token_term(a: Tensor | None, g: Tensor, weight: bool, form: str) -> Term:
    r"""A token-wise affine map :math:`z_t = W a_t + b`: implicit :math:`(\tilde a, g)` or explicit
    :math:`\sum_t g_t \tilde a_t^\top` (``a`` :math:`\tilde a`, ``(N, T, F)`` with the ones column when
    the bias is trainable, unused without a trainable weight; ``g`` ``(N, k, T, H)``)."""
    if not weight:
        return Explicit(g.sum(2))
    assert a is not None  # a trainable weight: its inputs are given
    if form == "implicit":
        return Implicit(a, g)
    n, k, t, h = g.shape
    gt = g.transpose(2, 3)  # (N, k, H, T)
    if gt.is_contiguous():  # one batched product over samples
        e = torch.bmm(gt.reshape(n, k * h, t), a)
    else:  # per output, so that cotangents laid out (k, N, ...) are read in place
        e = torch.stack([torch.bmm(gt[:, o], a) for o in range(k)], dim=1)
    return Explicit(e.reshape(n, k, h * a.shape[-1]))


def _token_piece(rule: Rule, label: str, tokens: int, f: int, h: int, weight: bool, bias: bool, k: int) -> Piece:
    f_tilde = f + int(bias) if weight else int(bias)
    params = h * f_tilde
    forms = FORMS if weight else ("explicit",)
    return rule._piece(label, "tokens", forms, tokens=tokens, width_in=f_tilde, width_out=h, params=params,
                       outputs=k, forward_macs=tokens * f * h)


class LinearRule(Rule):
    r"""``nn.Linear`` on ``(..., F)``: every axis but the sample axis and the last is a token axis.

    With one token the kernel is :math:`\langle \tilde a, \tilde a'\rangle \langle g_o, g'_{o'}\rangle`
    (implicit, :math:`F + \kappa H` per pair). With :math:`T` tokens (sequences, attention built from
    ``nn.Linear``) it is :math:`\sum_{t,t'}\langle\tilde a_t,\tilde a'_{t'}\rangle\langle g_t, g'_{t'}\rangle`,
    or explicitly the per-sample weight gradient :math:`\sum_t g_t \tilde a_t^\top`.
    """

    name = "linear"
    if TYPE_CHECKING:
        module: nn.Linear  # the modules it matches

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return _overrides(module, nn.Linear)

    def capture(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> tuple[list[Capture], Any]:
        a = args[0] if args else kwargs["input"]
        return [Capture("", output, {"a": a})], None

    def pieces(self, captures: list[Capture], axes: list[int], k: int) -> list[Piece]:
        (c,), (axis,) = captures, axes
        tokens = c.z.numel() // (c.z.shape[axis] * c.z.shape[-1])
        m = self.module
        return [_token_piece(self, "", tokens, m.in_features, m.out_features, "weight" in self.trainable,
                             "bias" in self.trainable, k)]

    def terms(self, captures, cots, axes, pieces, params) -> list[list[Term]]:
        (c,), (g,), (axis,), (piece,) = captures, cots, axes, pieces
        m = self.module
        weight, bias = "weight" in self.trainable, "bias" in self.trainable
        a = _augmented(_tokens(c.ctx["a"], axis, m.in_features), bias) if weight else None
        return [[_token_term(a, _cot_tokens(g, axis, m.out_features), weight, piece.form)]]


def unfold(x: Tensor, module: nn.Conv1d | nn.Conv2d | nn.Conv3d, ones: bool = False) -> Tensor:
    r"""Input patches of a convolution per group: ``(N, C, *S)`` -> ``(N, P, G, C / G * prod(kernel_size))``,
    the columns ordered as the flattened weight ``(C_out, C_in / G, *kernel_size)`` reads them; with
    ``ones``, each group's patches end in a column of ones (:math:`\tilde U`). One copy either way:
    appending the ones to copied patches was a second copy of them (its cost: docs/ntk.rst, "Benchmark")."""
    d = x.dim() - 2
    pad = module._reversed_padding_repeated_twice
    if any(pad):
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        x = F.pad(x, pad, mode=mode)
    for i in range(d):
        k, s, dil = module.kernel_size[i], module.stride[i], module.dilation[i]
        x = x.unfold(2 + i, dil * (k - 1) + 1, s)
        if dil > 1:
            x = x[..., ::dil]
    n, c, grid = x.shape[0], x.shape[1], x.shape[2 : 2 + d]
    g, width = module.groups, c // module.groups * math.prod(module.kernel_size)
    x = x.permute(0, *range(2, 2 + d), 1, *range(2 + d, 2 + 2 * d)).unflatten(1 + d, (g, c // g))
    out = x.new_empty(n, math.prod(grid), g, width + int(ones))
    out[..., :width].unflatten(-1, x.shape[2 + d :]).unflatten(1, grid).copy_(x)
    if ones:  # after the copy: a fresh buffer's pages fault in on first touch, and the copy touches all
        out[..., width].fill_(1)
    return out


class ConvRule(Rule):
    r"""``nn.Conv1d/2d/3d``: per group, a token-wise linear map of the input patches :math:`U_p`.

    Implicit: :math:`\sum_{p,q}\langle \tilde U_p, \tilde U'_q\rangle \langle g_p, g'_q\rangle` over output
    positions (:math:`P^2 (C_{in} k^d / G + \kappa C_{out} / G)` per pair and group); explicit: the
    per-sample weight gradient :math:`\sum_p g_p \otimes \tilde U_p` (:math:`C_{out} C_{in} k^d / G` per
    output). Large maps with few channels favour explicit, small maps with many channels implicit;
    the plan chooses per layer (:func:`~lazykern.ntk.choose_form`).
    """

    name = "conv"
    if TYPE_CHECKING:
        module: nn.Conv1d | nn.Conv2d | nn.Conv3d  # the modules it matches

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return any(_overrides(module, t) for t in (nn.Conv1d, nn.Conv2d, nn.Conv3d))

    def sample_axis_fixed(self) -> bool:
        return True

    def capture(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> tuple[list[Capture], Any]:
        x = args[0] if args else kwargs["input"]
        if x.dim() != output.dim() or x.dim() != len(self.module.kernel_size) + 2:  # module: self.module
            raise ValueError(f"module {self.layer!r} ({type(module).__name__}) needs batched inputs (N, C, ...)")
        return [Capture("", output, {"x": x})], None

    def pieces(self, captures, axes, k) -> list[Piece]:
        (c,) = captures
        m = self.module
        g = m.groups
        positions = math.prod(c.z.shape[2:])
        f = m.in_channels // g * math.prod(m.kernel_size)
        piece = _token_piece(self, "", positions, f, m.out_channels // g, "weight" in self.trainable,
                             "bias" in self.trainable, k)
        return [replace(piece, groups=g, params=g * piece.params, forward_macs=g * piece.forward_macs)]

    def terms(self, captures, cots, axes, pieces, params) -> list[list[Term]]:
        (c,), (g,), (piece,) = captures, cots, pieces
        m = self.module
        weight, bias = "weight" in self.trainable, "bias" in self.trainable
        cot = g.flatten(3).permute(1, 0, 3, 2)  # (N, k, P, C_out)
        if not weight:
            return [[Explicit(cot.sum(2))]]
        u, hg = unfold(c.ctx["x"], m, ones=bias), m.out_channels // m.groups
        terms = [_token_term(u[:, :, i], cot[..., i * hg : (i + 1) * hg], True, piece.form) for i in range(m.groups)]
        if piece.form == "explicit" and len(terms) > 1:
            explicit = cast("list[Explicit]", terms)  # what _token_term gives in the explicit form
            return [[Explicit(torch.cat([t.e for t in explicit], dim=-1))]]
        return [terms]


class _ScaleRule(Rule):
    r"""Per-channel (or per-element) affine normalization :math:`z = \hat x \odot \gamma + \beta`:
    the per-sample gradients :math:`\sum_{\text{positions}} g \odot \hat x` and :math:`\sum g`
    have the size of the parameters, so the rule is explicit."""

    def capture(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> tuple[list[Capture], Any]:
        # normalized inside the forward, where the parameters and buffers in use are bound
        x = args[0] if args else kwargs["input"]
        return [Capture("", output, {"xhat": self._normalized(x) if "weight" in self.trainable else None})], None

    def _normalized(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _layout(self, t: Tensor, axis: int, cot: bool) -> Tensor:
        """``x`` or cotangents -> ``(N, [k,] positions, channels)``."""
        raise NotImplementedError

    def pieces(self, captures, axes, k) -> list[Piece]:
        (c,), (axis,) = captures, axes
        per_sample = c.z.numel() // c.z.shape[axis]
        p = sum(_tensor(self.module, n).numel() for n in sorted(self.trainable))
        return [self._piece("", "scale", ("explicit",), tokens=1, width_in=0, width_out=0, params=p, outputs=k,
                            forward_macs=2 * per_sample)]

    def terms(self, captures, cots, axes, pieces, params) -> list[list[Term]]:
        (c,), (g,), (axis,) = captures, cots, axes
        cot = self._layout(g, axis, cot=True)
        parts = []
        if "weight" in self.trainable:
            parts.append((cot * self._layout(c.ctx["xhat"], axis, cot=False).unsqueeze(1)).sum(2))
        if "bias" in self.trainable:
            parts.append(cot.sum(2))
        return [[Explicit(torch.cat(parts, dim=-1))]]


class LayerNormRule(_ScaleRule):
    """``nn.LayerNorm`` with elementwise affine parameters (any leading token axes)."""

    name = "layer_norm"
    if TYPE_CHECKING:
        module: nn.LayerNorm  # the modules it matches

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return _overrides(module, nn.LayerNorm)

    def _normalized(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.module.normalized_shape, None, None, self.module.eps)

    def _layout(self, t: Tensor, axis: int, cot: bool) -> Tensor:
        width = math.prod(self.module.normalized_shape)
        return _cot_tokens(t, axis, width) if cot else _tokens(t, axis, width)


class _ChannelRule(_ScaleRule):
    def sample_axis_fixed(self) -> bool:
        return True

    def _layout(self, t: Tensor, axis: int, cot: bool) -> Tensor:
        if cot:  # (k, N, C, *S) -> (N, k, S, C)
            return t.reshape(*t.shape[:3], -1).permute(1, 0, 3, 2)
        return t.reshape(*t.shape[:2], -1).transpose(1, 2)


class GroupNormRule(_ChannelRule):
    """``nn.GroupNorm`` with affine parameters."""

    name = "group_norm"
    if TYPE_CHECKING:
        module: nn.GroupNorm  # the modules it matches

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return _overrides(module, nn.GroupNorm)

    def _normalized(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.module.num_groups, None, None, self.module.eps)


class BatchNormRule(_ChannelRule):
    """``nn.BatchNorm1d/2d/3d`` in eval mode (running statistics), affine parameters."""

    name = "batch_norm"
    if TYPE_CHECKING:
        module: nn.modules.batchnorm._BatchNorm  # the modules it matches

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        base = nn.modules.batchnorm._BatchNorm
        return isinstance(module, base) and type(module).forward is base.forward

    def _normalized(self, x: Tensor) -> Tensor:
        # written out rather than F.batch_norm: for a single sample, whose strides also read as
        # channels-last, its CPU double backward returned the input gradient permuted (torch 2.13)
        m = self.module
        assert m.running_mean is not None and m.running_var is not None  # eval mode: running statistics
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return (x - m.running_mean.view(shape)) * torch.rsqrt(m.running_var.view(shape) + m.eps)


class EmbeddingRule(Rule):
    r"""``nn.Embedding``: the per-sample gradient of the table is :math:`\sum_t \mathbb 1_{\text{tok}_t} \otimes g_t`,
    so the kernel is :math:`\sum_{t,t'} [\text{tok}_t = \text{tok}'_{t'}]\,\langle g_{o,t}, g'_{o',t'}\rangle`.

    Explicit (default): the gradient's non-zero rows, products by grouping equal tokens (cost
    proportional to the number of equal token pairs); implicit: the ``"equal"`` pair formula over
    all token pairs. Neither ever forms a vocabulary-sized vector. ``padding_idx`` rows get no gradient.
    """

    name = "embedding"
    if TYPE_CHECKING:
        module: nn.Embedding  # the modules it matches

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return _overrides(module, nn.Embedding)

    def capture(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> tuple[list[Capture], Any]:
        ids = args[0] if args else kwargs["input"]
        return [Capture("", output, {"ids": ids})], None

    def pieces(self, captures, axes, k) -> list[Piece]:
        (c,), (axis,) = captures, axes
        m = self.module
        ids = _tokens(c.ctx["ids"].unsqueeze(-1), axis, 1)[..., 0]
        tokens = ids.shape[1]
        # fraction of equal token pairs between two probe samples: the sparse form's work
        matches = int((ids[0][:, None] == ids[-1][None, :]).sum())
        return [self._piece("", "embedding", FORMS, tokens=tokens, width_in=1, width_out=m.embedding_dim,
                            params=m.num_embeddings * m.embedding_dim, outputs=k, forward_macs=tokens * m.embedding_dim,
                            match_fraction=max(matches, 1) / tokens**2)]

    def terms(self, captures, cots, axes, pieces, params) -> list[list[Term]]:
        (c,), (g,), (axis,), (piece,) = captures, cots, axes, pieces
        m = self.module
        ids = _tokens(c.ctx["ids"].unsqueeze(-1), axis, 1)[..., 0].long()
        cot = _cot_tokens(g, axis, m.embedding_dim)
        if m.padding_idx is not None:
            cot = cot * ids.ne(m.padding_idx)[:, None, :, None].to(cot.dtype)
        term = Sparse(ids, cot)
        return [[term if piece.form == "explicit" else term.as_implicit()]]


def _attention_mask(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return None if mask is None else mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


class MultiheadAttentionRule(Rule):
    r"""``nn.MultiheadAttention``: its input projections (query, key, value) and output projection
    are token-wise linear maps, each a :class:`LinearRule`-style piece.

    The module computes its projections inside ``F.multi_head_attention_forward``, where no hook
    reaches them; the rule's forward hook recomputes the attention from the same parameters as
    :math:`\operatorname{softmax}(q k^\top/\sqrt{d} + \text{mask})\, v` per head, so that the
    projections' outputs are tensors whose cotangents can be taken, and returns that output
    (masks, ``batch_first``, ``need_weights`` and ``average_attn_weights`` as the module).
    Modules with ``add_bias_kv`` or ``add_zero_attn`` use :class:`FallbackRule`.
    """

    name = "attention"
    if TYPE_CHECKING:
        module: nn.MultiheadAttention  # the modules it matches

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return (
            _overrides(module, nn.MultiheadAttention)
            and module.bias_k is None
            and not module.add_zero_attn
            and type(module.out_proj).forward is nn.Linear.forward
        )

    def claims(self) -> list[str]:
        return ["out_proj"]

    def sample_axis_fixed(self) -> bool:
        return True  # the captures are batch-first by construction

    def _projections(self) -> list[tuple[str, str, str | None, slice]]:
        """(label, weight name, bias name, rows of the bias) per input projection."""
        e = self.module.embed_dim
        names = (["in_proj_weight"] * 3 if self.module._qkv_same_embed_dim
                 else ["q_proj_weight", "k_proj_weight", "v_proj_weight"])
        return [(label, names[i], "in_proj_bias", slice(i * e, (i + 1) * e)) for i, label in enumerate("qkv")]

    def capture(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> tuple[list[Capture], Any]:
        m = self.module  # the module hooked: ``module``
        names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
                 "is_causal")
        call = {**dict(zip(names, args)), **kwargs}
        query, key, value = call["query"], call["key"], call["value"]
        if query.dim() != 3:
            raise ValueError(f"module {self.layer!r} (MultiheadAttention) needs batched (3-D) inputs")
        if not m.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        n, length, e = query.shape
        s, heads, d = key.shape[1], m.num_heads, m.head_dim
        captures, projected = [], []
        for (label, wname, bname, rows), inp in zip(self._projections(), (query, key, value)):
            w = _tensor(m, wname)
            w = w[rows] if wname == "in_proj_weight" else w
            b = None if m.in_proj_bias is None else m.in_proj_bias[rows]
            z = F.linear(inp, w, b)
            captures.append(Capture(label, z, {"a": inp}))
            projected.append(z)
        q, k, v = (t.reshape(n, -1, heads, d).transpose(1, 2) for t in projected)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        mask = call.get("attn_mask")
        if mask is None and call.get("is_causal", False):
            mask = torch.ones(length, s, dtype=torch.bool, device=q.device).triu(1)
        mask = _attention_mask(mask, scores.dtype)
        if mask is not None:
            scores = scores + (mask.reshape(n, heads, length, s) if mask.dim() == 3 else mask)
        padding = _attention_mask(call.get("key_padding_mask"), scores.dtype)
        if padding is not None:
            scores = scores + padding.reshape(n, 1, 1, s)
        attn = torch.softmax(scores, dim=-1)
        mixed = (attn @ v).transpose(1, 2).reshape(n, length, e)
        out = F.linear(mixed, m.out_proj.weight, m.out_proj.bias)
        captures.append(Capture("out", out, {"a": mixed}))
        weights = None
        if call.get("need_weights", True):
            weights = attn.mean(1) if call.get("average_attn_weights", True) else attn
        return captures, (out if m.batch_first else out.transpose(0, 1), weights)

    def _flags(self) -> list[tuple[bool, bool]]:
        t = self.trainable
        flags = [(w in t, b in t) for _, w, b, _ in self._projections()]
        return flags + [("out_proj.weight" in t, "out_proj.bias" in t)]

    def pieces(self, captures, axes, k) -> list[Piece]:
        out = []
        for c, (weight, bias) in zip(captures, self._flags()):
            if not (weight or bias):
                continue
            n, tokens, h = c.z.shape
            out.append(_token_piece(self, c.label, tokens, c.ctx["a"].shape[-1], h, weight, bias, k))
        out[0].forward_macs += 2 * captures[0].z.shape[1] * captures[1].z.shape[1] * self.module.embed_dim
        return out

    def terms(self, captures, cots, axes, pieces, params) -> list[list[Term]]:
        by_label = {p.label: p for p in pieces}
        out = []
        for c, g, (weight, bias) in zip(captures, cots, self._flags()):
            if c.label in by_label:
                a = _augmented(c.ctx["a"], bias) if weight else None
                out.append([_token_term(a, g.transpose(0, 1), weight, by_label[c.label].form)])
        return out


class FallbackRule(Rule):
    """Any other module with trainable parameters: explicit per-sample gradients of its own
    parameters (and of children it covers) through :func:`torch.func.vjp`, with a
    :class:`NTKFallbackWarning` naming the module and the memory."""

    name = "fallback"

    def __init__(self, layer: str, module: nn.Module, trainable: set[str]) -> None:
        super().__init__(layer, module, trainable)
        self.covered: list[str] = []

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return True

    def sample_axis_fixed(self) -> bool:
        return True

    def capture(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> tuple[list[Capture], Any]:
        if not isinstance(output, Tensor):
            raise ValueError(f"module {self.layer!r} returned {type(output).__name__}; expected one tensor")
        return [Capture("", output, {"args": args, "kwargs": kwargs})], None

    def pieces(self, captures, axes, k) -> list[Piece]:
        p = sum(_tensor(self.module, n).numel() for n in self.trainable)
        (c,) = captures
        return [self._piece("", "fallback", ("explicit",), tokens=1, width_in=0, width_out=0, params=p, outputs=k,
                            forward_macs=p * max(1, c.z[0].numel() // max(1, p)))]

    def terms(self, captures, cots, axes, pieces, params) -> list[list[Term]]:
        (c,), (cot,) = captures, cots
        names = sorted(self.trainable)
        fixed = {n: t for n, t in params.items() if n not in self.trainable}
        args, kwargs = c.ctx["args"], c.ctx["kwargs"]
        in_dims = tuple(0 if isinstance(a, Tensor) else None for a in args)

        def one(g_b: Tensor, *args_b: Any) -> dict[str, Tensor]:
            def f(p: dict[str, Tensor]) -> Tensor:
                batched = tuple(a.unsqueeze(0) if isinstance(a, Tensor) else a for a in args_b)
                return functional_call(self.module, {**fixed, **p}, batched, kwargs)

            pullback = vjp(f, {n: params[n] for n in names})[1]
            return vmap(pullback)(g_b.unsqueeze(1))[0]

        grads = vmap(one, in_dims=(0, *in_dims))(cot.transpose(0, 1), *args)
        n, k = cot.shape[1], cot.shape[0]
        return [[Explicit(torch.cat([grads[name].reshape(n, k, -1) for name in names], dim=-1))]]

    def warn(self, piece: Piece, total: int, itemsize: int) -> None:
        warnings.warn(
            f"lazykern.ntk: module {self.layer!r} ({type(self.module).__name__}) has no NTK rule; using "
            f"explicit per-sample gradients of its {piece.params} parameters "
            f"({total * piece.outputs * piece.params * itemsize / 2**20:.1f} MiB for {total} samples)",
            NTKFallbackWarning,
            stacklevel=5,
        )


#: The rules tried in order; the first that matches a module handles it.
RULES: tuple[type[Rule], ...] = (
    LinearRule,
    ConvRule,
    LayerNormRule,
    GroupNormRule,
    BatchNormRule,
    EmbeddingRule,
    MultiheadAttentionRule,
    FallbackRule,
)


def rule_for(module: nn.Module) -> type[Rule]:
    """The rule class that handles ``module``."""
    return next(r for r in RULES if r.matches(module))
