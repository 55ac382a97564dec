r"""Per-sample NTK features of a network: which rule handles each module, and one batched backward.

:func:`inspect_network` runs two small probe forward passes (2 and 3 copies of the first samples)
with a forward hook on every module that owns trainable parameters, to learn which modules run,
each captured tensor's sample axis (the axis whose length follows the batch), the number of
outputs and every layer's sizes (:class:`~lazykern.ntk.rules.Piece`).

``stream`` then forms the features of sample batches: the network runs once per batch through
``torch.func.functional_call`` with the operator's own tensors (parameters and buffers) and
the hooks; one backward pass, vectorised over the :math:`k` one-hot output cotangents
(``is_grads_batched``), gives the cotangents of every captured output, and each rule turns its
captures into :mod:`~lazykern.ntk.terms`. With ``differentiable=True`` the backward pass keeps its
graph (``create_graph``), so the features, and every NTK value formed from them, differentiate with
respect to the inputs and the tensors that require grad.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from torch.func import functional_call

from .. import settings
from .rules import Capture, FallbackRule, Piece, Rule, rule_for
from .terms import Term, cat_terms, map_terms, write_terms
from .throughput import synchronize

__all__ = ["Unit", "Network", "check_network", "inspect_network", "stream", "extract", "substituted", "piece_terms", "batch_bytes"]


#: Samples a batch of the extraction holds at least, within four :func:`batch_bytes`.
BATCH_SAMPLES = 32

#: The largest single tensor that raising a batch to ``BATCH_SAMPLES`` may create. glibc's malloc
#: maps a block above 32 MiB (its largest mmap threshold) fresh from the OS at every allocation,
#: and every first write to a page faults, so a batch of fewer samples whose stack stays below the
#: threshold is faster (measured: docs/ntk.rst, "Benchmark").
FLOOR_TENSOR_BYTES = 32 * 2**20


def batch_bytes() -> int:
    """Memory a sample batch of the extraction (activations, cotangents, graph) aims for.

    Sixteen :class:`lazykern.settings.chunk_bytes` (64 MiB by default): each batch costs a
    forward and a backward pass with per-call overheads of milliseconds, so batches must hold
    many samples, yet stay far below the features and kernel blocks they feed. Networks whose
    samples are large get up to four times that to reach ``BATCH_SAMPLES`` samples: a handful of
    samples a batch made the per-batch passes dominate, and more than 32 made a small CNN slower
    (measured on ``benchmarks/ntk.py``'s networks: docs/ntk.rst, "Benchmark"). That raise stops
    where one captured output's stacked cotangents would exceed ``FLOOR_TENSOR_BYTES``.

    A sample set whose whole extraction fits within those same two ceilings runs as one batch:
    with few samples the per-operation costs dominate (each small operation of a batch may wake
    another thread), so one batch is faster there. Larger sets keep the budget's batches, which
    bound their memory.

    Example:
        >>> import lazykern
        >>> with lazykern.settings.chunk_bytes(2**20):
        ...     batch_bytes()
        16777216
    """
    return 16 * settings.chunk_bytes.value()


@dataclass
class Unit:
    """One module with trainable parameters, the rule handling it and what the probe learned.

    Attributes:
        rule: the :class:`~lazykern.ntk.rules.Rule` instance handling the module.
        axes: the sample axis of each of the rule's captures.
        pieces: the module's parameter blocks (:class:`~lazykern.ntk.rules.Piece`).
    """

    rule: Rule
    axes: list[int]
    pieces: list[Piece]

    @property
    def name(self) -> str:
        return self.rule.layer


@dataclass
class Network:
    """What the probe forward passes (:func:`inspect_network`) learned about a network.

    Attributes:
        model: the network.
        units: one :class:`Unit` per module with trainable parameters, in the order they run.
        num_outputs: :math:`k`, outputs per sample.
        sample_shape: the shape of one input sample.
        input_dtype: the inputs' dtype (floating, or integer token ids).
        dtype: the parameters' dtype.
        trainable: qualified names of the parameters the NTK differentiates.
        work_numel: numbers held per sample while its features are formed.
        largest_numel: numbers per sample of the largest single tensor every batch forms: a
            captured output's stacked cotangents (features depend on the forms chosen later).
    """

    model: nn.Module
    units: list[Unit]
    num_outputs: int
    sample_shape: tuple[int, ...]
    input_dtype: torch.dtype
    dtype: torch.dtype  # of the parameters
    trainable: tuple[str, ...]  # qualified parameter names the NTK differentiates
    work_numel: int  # numbers held per sample while its features are formed
    largest_numel: int  # numbers per sample of the largest stacked cotangents

    @property
    def pieces(self) -> list[Piece]:
        return [p for u in self.units for p in u.pieces]

    def batch_size(self, total: int, itemsize: int) -> int:
        per_sample, largest, ceiling = self.work_numel * itemsize, self.largest_numel * itemsize, 4 * batch_bytes()
        if total * per_sample <= ceiling and total * largest <= FLOOR_TENSOR_BYTES:
            return total
        budget = batch_bytes() // per_sample
        floor = min(BATCH_SAMPLES, ceiling // per_sample, FLOOR_TENSOR_BYTES // largest)
        return int(min(total, max(1, budget, floor)))


def _trainable_own(module: nn.Module) -> dict[str, Tensor]:
    return {n: p for n, p in module.named_parameters(recurse=False) if p.requires_grad}


def check_network(model: object) -> None:
    """Refuse what the NTK cannot answer correctly, before anything runs."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    named = list(model.named_parameters(remove_duplicate=False))
    if not any(p.requires_grad for _, p in named):
        raise ValueError("model has no trainable parameters (every parameter has requires_grad=False)")
    seen: dict[int, str] = {}
    for name, p in named:
        if p.requires_grad and id(p) in seen:
            raise ValueError(
                f"model shares (ties) parameter {seen[id(p)]!r} with {name!r}; the per-layer NTK "
                "features would count it twice, so tied parameters are not supported"
            )
        seen[id(p)] = name
    for name, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            if module.training:
                raise ValueError(
                    f"module {name!r} ({kind}) is in training mode, which couples the samples of a batch; "
                    "call model.eval() first"
                )
            if not module.track_running_stats:
                raise ValueError(
                    f"module {name!r} ({kind}) has track_running_stats=False, so even in eval mode it "
                    "normalizes with batch statistics, which couples the samples of a batch"
                )
        dropout = (isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0) or (
            isinstance(module, nn.MultiheadAttention) and module.dropout > 0
        )
        if dropout and module.training:
            raise ValueError(
                f"module {name!r} ({kind}) is in training mode, which makes the network random; "
                "call model.eval() first"
            )
        if isinstance(module, nn.Embedding) and (module.max_norm is not None or module.scale_grad_by_freq):
            raise ValueError(
                f"module {name!r} (Embedding) has max_norm={module.max_norm} and scale_grad_by_freq="
                f"{module.scale_grad_by_freq}; expected max_norm=None (it rewrites the weights during the "
                "forward) and scale_grad_by_freq=False (its gradients are not the Jacobian)"
            )


class _Recorder:
    """Forward hooks that hand each unit's forward to its rule; removed on exit (also on error).

    With ``keep=False`` the hooks only substitute the rules' outputs (the attention recomputed
    from its projections, which unlike fused attention kernels has second derivatives).
    """

    def __init__(self, rules: list[Rule], keep: bool = True) -> None:
        self.rules, self.keep = rules, keep
        self.records: dict[str, list[Capture]] = {}
        self.active = False

    def _hook(self, rule: Rule):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if not self.active:
                return None
            if rule.layer in self.records:
                raise ValueError(
                    f"module {rule.layer!r} ran twice in one forward pass; reusing a module ties its "
                    "parameters, which is not supported"
                )
            captures, replacement = rule.capture(module, args, kwargs, output)
            self.records[rule.layer] = captures if self.keep else []
            out = output if replacement is None else replacement
            # Later in-place operations (ReLU(inplace=True)) must not change a captured output.
            if isinstance(out, Tensor):
                return out.clone()
            if isinstance(out, tuple):
                return tuple(o.clone() if isinstance(o, Tensor) else o for o in out)
            return out

        return hook

    @contextlib.contextmanager
    def recording(self) -> Iterator["_Recorder"]:
        handles = [r.module.register_forward_hook(self._hook(r), with_kwargs=True) for r in self.rules]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            self.active = False
            self.records = {}

    def run(self, model: nn.Module, params: dict[str, Tensor], x: Tensor) -> Any:
        self.records = {}
        self.active = True
        try:
            return functional_call(model, params, (x,))
        finally:
            self.active = False


def _rules(model: nn.Module) -> list[Rule]:
    """One rule per module owning trainable parameters; children a rule claims join their claimant."""
    rules: list[Rule] = []
    claimed: dict[str, Rule] = {}
    for name, module in model.named_modules():
        owner = next((r for prefix, r in claimed.items() if name == prefix or name.startswith(prefix + ".")), None)
        own = _trainable_own(module)
        if owner is not None:
            rel = name[len(owner.layer) + 1 :] if owner.layer else name
            owner.trainable |= {f"{rel}.{n}" for n in own}
            continue
        if not own:
            continue
        rule = rule_for(module)(name, module, set(own))
        rules.append(rule)
        for child in rule.claims():
            claimed[f"{name}.{child}" if name else child] = rule
    return rules


@contextlib.contextmanager
def substituted(net: "Network") -> Iterator[Callable[[dict[str, Tensor], Tensor], Tensor]]:
    """A forward ``(tensors, x) -> (N, k)`` outputs through the rules' substitutes (hooks removed on exit)."""
    recorder = _Recorder([u.rule for u in net.units], keep=False)
    with recorder.recording():
        yield lambda call, x: _flat_outputs(recorder.run(net.model, call, x), x.shape[0])


def _flat_outputs(out: object, batch: int) -> Tensor:
    if not isinstance(out, Tensor):
        raise ValueError(f"model must return one tensor, got {type(out).__name__}")
    if out.dim() == 0 or out.shape[0] != batch:
        raise ValueError(
            f"model output has shape {tuple(out.shape)} for a batch of {batch} samples; the NTK needs "
            "outputs (batch, ...) with one row per sample"
        )
    return out.reshape(batch, -1)


def call_params(model: nn.Module, tensors: dict[str, Tensor], trainable: tuple[str, ...]) -> dict[str, Tensor]:
    """The tensors a forward runs with: trainable parameters as tensors that require grad (the
    operator's own when they do, else fresh leaves), so every captured output has a graph."""
    out = dict(tensors)
    for n in trainable:
        if not out[n].requires_grad:
            out[n] = out[n].detach().requires_grad_(True)
    return out


def model_tensors(model: nn.Module) -> dict[str, Tensor]:
    """Every floating parameter and buffer of ``model``, detached (what an NTK operator holds)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return {n: t.detach() for n, t in named if t.is_floating_point()}


def _probe(model, rules, params, x, batch: int) -> tuple[Tensor, dict[str, list[Capture]]]:
    recorder = _Recorder(rules)
    idx = torch.arange(batch, device=x.device).clamp(max=x.shape[0] - 1) if batch == 2 else torch.zeros(batch, dtype=torch.long, device=x.device)
    with recorder.recording(), torch.enable_grad():
        try:
            out = recorder.run(model, params, x[idx])
        except ValueError:
            raise
        except Exception as err:  # the model's own shape and type errors, named as an input problem
            raise ValueError(
                f"model cannot be applied to inputs of shape (batch, {', '.join(map(str, x.shape[1:]))}) "
                f"and dtype {x.dtype}: {err}"
            ) from err
        out = _flat_outputs(out, batch)
        return out, dict(recorder.records)


def _sample_axis(rule: Rule, label: str, shape2: torch.Size, shape3: torch.Size) -> int:
    axes = [i for i, (a, b) in enumerate(zip(shape2, shape3)) if a != b] if len(shape2) == len(shape3) else []
    if len(axes) != 1 or shape2[axes[0]] != 2 or shape3[axes[0]] != 3:
        raise ValueError(
            f"module {rule.layer!r} ({type(rule.module).__name__}) output{f' {label!r}' if label else ''} has shapes "
            f"{tuple(shape2)} and {tuple(shape3)} for 2 and 3 samples; the NTK needs one axis that indexes samples"
        )
    if rule.sample_axis_fixed() and axes[0] != 0:
        raise ValueError(
            f"module {rule.layer!r} ({type(rule.module).__name__}) sees samples along axis {axes[0]}; "
            "its rule needs them first"
        )
    return axes[0]


def inspect_network(model: nn.Module, x: Tensor, tensors: dict[str, Tensor]) -> Network:
    """Probe forward passes on 2 and 3 samples: outputs, units, sample axes, sizes."""
    params = [p for p in model.parameters() if p.requires_grad]
    dtype = params[0].dtype
    if x.is_floating_point() and x.dtype != dtype:
        raise TypeError(f"inputs have dtype {x.dtype} but the model's parameters are {dtype}")
    if x.device != params[0].device:
        raise ValueError(f"inputs are on {x.device} but the model's parameters are on {params[0].device}")
    rules = _rules(model)
    trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    call = call_params(model, tensors, trainable)
    out, records = _probe(model, rules, call, x, 2)
    rules = _reached(model, rules, records, out, call)
    _, records3 = _probe(model, rules, call, x, 3)
    k = out.shape[1]
    units, work, largest = [], k, k
    for rule in rules:
        captures = records[rule.layer]
        axes = [_sample_axis(rule, c.label, c.z.shape, c3.z.shape) for c, c3 in zip(captures, records3[rule.layer])]
        pieces = rule.pieces(captures, axes, k)
        if isinstance(rule, FallbackRule):
            rule.warn(pieces[0], x.shape[0], torch.empty((), dtype=dtype).element_size())
        units.append(Unit(rule, axes, pieces))
        for c in captures:
            ctx = sum(t.numel() for t in c.ctx.values() if isinstance(t, Tensor))
            work += (ctx + (k + 2) * c.z.numel()) // 2
            largest = max(largest, k * c.z.numel() // 2)
    for p in (p for u in units for p in u.pieces):
        work += 2 * max(p.feature_numel(f) for f in p.forms) + p.groups * p.tokens * p.width_in
    return Network(model, units, k, tuple(x.shape[1:]), x.dtype, dtype, trainable, work, largest)


def _reached(model: nn.Module, rules: list[Rule], records: dict, out: Tensor, call: dict[str, Tensor]) -> list[Rule]:
    """Rules whose module ran. A module that did not run but whose parameters reach the output is
    covered by a fallback ancestor that ran (it differentiates through the child), else refused."""
    ran = [r for r in rules if r.layer in records]
    kept = []
    for r in rules:
        if r.layer in records:
            kept.append(r)
            continue
        parent = next(
            (p for p in ran if isinstance(p, FallbackRule) and (not p.layer or r.layer.startswith(p.layer + "."))),
            None,
        )
        if parent is not None:
            rel = r.layer[len(parent.layer) + 1 :] if parent.layer else r.layer
            parent.trainable |= {f"{rel}.{n}" for n in r.trainable}
            continue
        prefix = f"{r.layer}." if r.layer else ""
        leaves = [call[prefix + n] for n in r.trainable]
        grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True, retain_graph=True) if out.requires_grad else []
        if any(g is not None for g in grads):
            raise ValueError(
                f"the parameters of module {r.layer!r} affect the output without its forward being "
                "called (used functionally by a parent module); not supported"
            )
    if not kept:
        raise ValueError("none of the model's trainable parameters affects its output")
    return kept


def _local(params: dict[str, Tensor], layer: str) -> dict[str, Tensor]:
    if not layer:
        return params
    prefix = layer + "."
    return {n[len(prefix) :]: t for n, t in params.items() if n.startswith(prefix)}


@dataclass
class _BackwardTiming:
    """Sample streams taken so far and the fastest measured seconds per sample of each way."""

    calls: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


#: The ways the first sample streams take (a stream: one operator call's extraction, in sample
#: batches): the first warms up what either loads on first use, then each way twice, alternately.
#: Whole streams are timed: the plain passes' stacking buffers are allocated by a stream's first
#: batch and reused by the rest, so single batches misjudged them, and one timing each picked the
#: slower way for the benchmark's ``conv_gap`` in two runs of three (docs/ntk.rst, "Benchmark").
_TIMED_WAYS = ("loop", "batched", "loop", "batched", "loop")
#: The two backward ways: ``k`` plain reverse passes, or one vectorised over the outputs.
BACKWARD_WAYS = ("loop", "batched")


def _backward_way(timing: _BackwardTiming, differentiable: bool) -> str:
    if differentiable:
        return "loop"
    if timing.calls < len(_TIMED_WAYS):
        return _TIMED_WAYS[timing.calls]
    return min(timing.seconds, key=timing.seconds.__getitem__)


#: Per network (held weakly) and input kind: timing shared by every operator on that network (a
#: GP's kernel builds one at every step, a benchmark at every repeat), so the ways are measured once.
_BACKWARD_TIMING: "weakref.WeakKeyDictionary[nn.Module, dict[tuple, _BackwardTiming]]" = weakref.WeakKeyDictionary()


def _cotangents(
    out: Tensor, wanted: list[Tensor], way: str, differentiable: bool, buffers: dict[int, Tensor] | None
) -> list[Tensor | None]:
    r""":math:`\partial f_o / \partial z` for every output ``o`` and captured ``z``, ``(k, *z.shape)`` each.

    Either one backward pass vectorised over the one-hot output cotangents (``is_grads_batched``:
    few large operations, but operations without a batching rule fall back to slow loops, much
    slower than plain passes for a global average pool) or ``k`` plain backward
    passes. The first sample streams a network meets (in any operator on it) take the ways in turn
    (:data:`_TIMED_WAYS`) and :func:`stream` times them; later streams take the faster. With a
    graph (``differentiable``) always the plain passes: the batched double backward lacks batching
    rules for some layers (a group norm's, for one).

    The plain passes' gradients are stacked into ``buffers`` (one per captured tensor, reused by
    every batch of a stream) when given: a fresh stack of a conv layer's cotangents is often above
    the C allocator's mmap threshold (32 MiB), so each batch paid a page fault per 4 KiB written,
    several times the copy itself (measured: docs/ntk.rst, "Benchmark").
    """
    k, n = out.shape[1], out.shape[0]
    eye = torch.eye(k, dtype=out.dtype, device=out.device)
    if way == "batched":
        # Optional entries: allow_unused gives None for a tensor the outputs do not depend on.
        grads: list[Tensor | None] = list(torch.autograd.grad(out, wanted, grad_outputs=eye.unsqueeze(1).expand(k, n, k),
                                         is_grads_batched=True, create_graph=differentiable, allow_unused=True))
    else:
        per_output = [
            torch.autograd.grad(out, wanted, grad_outputs=eye[o].expand(n, k), retain_graph=differentiable or o < k - 1,
                                create_graph=differentiable, allow_unused=True)
            for o in range(k)
        ]
        # samples first in memory, (k, N, ...) as a view: per-sample gradients then read it in place
        grads = [None if gs[0] is None else _stack_samples_first(gs, buffers, i)
                 for i, gs in enumerate(zip(*per_output))]
    return grads


def _stack_samples_first(grads: tuple[Tensor, ...], buffers: dict[int, Tensor] | None, slot: int) -> Tensor:
    """The ``k`` gradients ``(N, ...)`` as a ``(k, N, ...)`` view of ``(N, k, ...)`` memory, written into
    ``buffers[slot]`` (grown when too small; a shorter last batch uses its leading rows)."""
    n, rest = grads[0].shape[0], grads[0].shape[1:]
    if buffers is None:
        return torch.stack(grads, dim=1).transpose(0, 1)
    g, buf = grads[0], buffers.get(slot)
    if buf is None or not (buf.shape[0] >= n and buf.shape[1:] == (len(grads), *rest)
                           and (buf.dtype, buf.device) == (g.dtype, g.device)):
        buf = buffers[slot] = g.new_empty((n, len(grads), *rest))
    return torch.stack(grads, dim=1, out=buf[:n]).transpose(0, 1)


def _batch_terms(
    net: Network,
    recorder: _Recorder,
    call: dict[str, Tensor],
    x: Tensor,
    differentiable: bool,
    way: str = "loop",
    buffers: dict[int, Tensor] | None = None,
) -> list[list[Term]]:
    k, n = net.num_outputs, x.shape[0]
    out = _flat_outputs(recorder.run(net.model, call, x), n)
    records = recorder.records
    captures = [(u, c) for u in net.units for c in records[u.name]]
    wanted = [c.z for _, c in captures if c.z.requires_grad]
    grads = iter(_cotangents(out, wanted, way, differentiable, buffers))
    terms: list[list[Term]] = []
    for u in net.units:
        cots = []
        for c in records[u.name]:
            g = next(grads) if c.z.requires_grad else None
            cots.append(torch.zeros((k, *c.z.shape), dtype=c.z.dtype, device=c.z.device) if g is None else g)
        terms += u.rule.terms(records[u.name], cots, u.axes, u.pieces, _local(call, u.name))
    if not differentiable:
        terms = [map_terms(t, Tensor.detach) for t in terms]
    return terms


def stream(
    net: Network,
    tensors: dict[str, Tensor],
    x: Tensor,
    consume: Callable[[slice, list[Term]], None],
    *,
    differentiable: bool = False,
    way: str | None = None,
) -> None:
    """Call ``consume(rows, terms)`` for each sample batch of ``x``; hooks are removed on return and
    on error (a callback rather than a generator, so no suspended generator keeps them).

    Without ``differentiable``, the terms of a batch may be views of buffers the next batch
    overwrites: ``consume`` copies or reduces them before it returns. ``way`` forces the backward
    way (``"loop"`` or ``"batched"``, ``BACKWARD_WAYS``) instead of the network's measured choice:
    both are exact, but round differently, so a job that must give the same bits every time pins one."""
    n = x.shape[0]
    step = net.batch_size(n, torch.empty((), dtype=net.dtype).element_size())
    recorder = _Recorder([u.rule for u in net.units])
    call = call_params(net.model, tensors, net.trainable)
    buffers: dict[int, Tensor] | None = None if differentiable else {}
    timing = _BACKWARD_TIMING.setdefault(net.model, {}).setdefault(
        (net.sample_shape, net.input_dtype, net.dtype, x.device.type), _BackwardTiming())
    timed = way is None
    way, spent = (_backward_way(timing, differentiable) if way is None else way), 0.0
    with recorder.recording(), torch.enable_grad():
        for start in range(0, n, step):
            rows = slice(start, min(n, start + step))
            xb = x[rows] if differentiable else x[rows].detach()
            synchronize(x.device)
            began = time.perf_counter()
            terms = _batch_terms(net, recorder, call, xb, differentiable, way, buffers)
            synchronize(x.device)
            spent += time.perf_counter() - began  # not consume's time: it may stream another set
            consume(rows, [t for piece in terms for t in piece])
    if timed and not differentiable:
        if 1 <= timing.calls < len(_TIMED_WAYS):
            timing.seconds[way] = min(timing.seconds.get(way, float("inf")), spent / n)
        timing.calls += 1


def piece_terms(net: Network, tensors: dict[str, Tensor], x: Tensor) -> list[list[Term]]:
    """The features of ``x`` (one batch) per piece of ``net.pieces``: what the plan describes."""
    recorder = _Recorder([u.rule for u in net.units])
    with recorder.recording(), torch.enable_grad():
        return _batch_terms(net, recorder, call_params(net.model, tensors, net.trainable), x, False)


def extract(net: Network, tensors: dict[str, Tensor], x: Tensor, *, differentiable: bool = False,
            way: str | None = None) -> list[Term]:
    """All features of ``x`` (``way``: as for :func:`stream`)."""
    parts: list[list[Term]] = []
    if differentiable:  # concatenation keeps the graph
        stream(net, tensors, x, lambda rows, t: parts.append(t), differentiable=True)
        return parts[0] if len(parts) == 1 else cat_terms(parts)
    out: list[list[Term] | None] = [None]

    def consume(rows: slice, terms: list[Term]) -> None:
        out[0] = write_terms(out[0], rows, terms, x.shape[0])

    stream(net, tensors, x, consume, way=way)
    assert out[0] is not None  # x has samples: one batch at least
    return out[0]
