r"""Per-sample NTK features of a network, from forward hooks and one batched backward pass.

For each sample batch the network runs once with forward hooks on every module that owns
trainable parameters; the hooks keep each module's inputs and output. One backward pass,
vectorised over the :math:`k` one-hot output cotangents (``is_grads_batched``), then gives the
cotangents :math:`g_o = \partial f_o / \partial z` at every recorded output :math:`z`.

* ``nn.Linear`` on ``(B, F)`` inputs: the factored term :math:`(\tilde a, G)` with
  :math:`\tilde a = (a, 1)` when the bias is trainable (see :mod:`lazykern.formulas.ntk`).
* ``nn.Linear`` on ``(B, T, F)`` inputs: the token-pair sum
  :math:`\sum_{t,t'} \langle a_t, a'_{t'}\rangle \langle g_t, g'_{t'}\rangle` is not a product of two dot
  products; it equals :math:`\langle \sum_t g_t a_t^\top, \sum_{t'} g'_{t'} a'^\top_{t'} \rangle`, so the
  explicit per-sample weight gradient :math:`\sum_t g_t \tilde a_t^\top` is the feature.
* any other module with trainable parameters: explicit per-sample gradients from
  :func:`torch.func.vjp` through that module alone, with a :class:`NTKFallbackWarning`.

All explicit features are concatenated into one term whose first factor is the constant 1.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap

from .. import settings

__all__ = [
    "NTKFallbackWarning",
    "Features",
    "NetworkInfo",
    "check_network",
    "inspect_network",
    "stream",
    "extract",
    "feature_bytes",
]


class NTKFallbackWarning(UserWarning):
    """A module has no factored NTK rule and costs explicit per-sample gradients."""


@dataclass
class Features:
    r"""NTK features of N samples: ``terms`` is a list of ``(A, G)`` pairs, ``A`` ``(N, F)`` or
    ``None`` (the constant 1), ``G`` ``(N, k, H)``, with
    :math:`\Theta_{(i,o),(j,o')} = \sum_{(A, G)} \langle A_i, A_j\rangle \langle G_{io}, G_{jo'}\rangle`."""

    terms: list[tuple[Tensor | None, Tensor]]

    @staticmethod
    def cat(parts: list["Features"]) -> "Features":
        terms = []
        for t in range(len(parts[0].terms)):
            a = None if parts[0].terms[t][0] is None else torch.cat([p.terms[t][0] for p in parts])
            terms.append((a, torch.cat([p.terms[t][1] for p in parts])))
        return Features(terms)

    def index(self, idx: slice | Tensor) -> "Features":
        return Features([(None if a is None else a[idx], g[idx]) for a, g in self.terms])


@dataclass
class _Unit:
    """One module that owns trainable parameters and how its features are formed."""

    name: str
    module: nn.Module
    kind: str  # "linear" (factored or token), "fallback"
    weight: bool = False
    bias: bool = False
    params: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class NetworkInfo:
    """What a probe forward pass learned about a network: the units, outputs and feature sizes."""

    units: list[_Unit]
    num_outputs: int
    num_params: int
    sample_shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    feature_numel: int  # per sample, all terms, full mode
    implicit_dims: list[tuple[int, int]]  # (F, H) per factored term
    explicit_dim: int  # P of the explicit term (0: none)
    work_numel: int  # per sample, activations and cotangents held during extraction


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
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            raise ValueError(
                f"module {name!r} ({type(module).__name__}) is in training mode, which couples the "
                "samples of a batch; call model.eval() first"
            )
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.training and module.p > 0:
            raise ValueError(
                f"module {name!r} ({type(module).__name__}) is in training mode, which makes the "
                "network random; call model.eval() first"
            )


class _Recorder:
    """Forward hooks that keep each unit's inputs and output, removed on exit (also on error)."""

    def __init__(self, units: list[_Unit]) -> None:
        self.units = units
        self.records: dict[str, tuple[tuple, dict, Tensor]] = {}
        self.active = False

    def _hook(self, unit: _Unit):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: object):
            if not self.active:
                return None
            if unit.name in self.records:
                raise ValueError(
                    f"module {unit.name!r} ran twice in one forward pass; reusing a module ties its "
                    "parameters, which is not supported"
                )
            if not isinstance(output, Tensor):
                raise ValueError(f"module {unit.name!r} returned {type(output).__name__}; expected one tensor")
            self.records[unit.name] = (args, kwargs, output)
            # Later in-place operations (ReLU(inplace=True)) must not change the recorded output.
            return output.clone()

        return hook

    @contextlib.contextmanager
    def recording(self) -> Iterator["_Recorder"]:
        handles = [u.module.register_forward_hook(self._hook(u), with_kwargs=True) for u in self.units]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            self.active = False
            self.records = {}

    def run(self, model: nn.Module, x: Tensor) -> Tensor:
        self.records = {}
        self.active = True
        try:
            return model(x)
        finally:
            self.active = False


def _units(model: nn.Module) -> list[_Unit]:
    units = []
    for name, module in model.named_modules():
        params = _trainable_own(module)
        if not params:
            continue
        if type(module) is nn.Linear:
            units.append(_Unit(name or "<model>", module, "linear", "weight" in params, "bias" in params))
        else:
            units.append(_Unit(name or "<model>", module, "fallback", params=params))
    return units


def _flat_outputs(out: object, batch: int) -> Tensor:
    if not isinstance(out, Tensor):
        raise ValueError(f"model must return one tensor, got {type(out).__name__}")
    if out.dim() == 0 or out.shape[0] != batch:
        raise ValueError(
            f"model output has shape {tuple(out.shape)} for a batch of {batch} samples; the NTK needs "
            "outputs (batch, ...) with one row per sample"
        )
    return out.reshape(batch, -1)


def inspect_network(model: nn.Module, x: Tensor, total: int) -> NetworkInfo:
    """Probe forward pass on two samples: outputs, which units run, feature sizes; warns for fallbacks.

    Args:
        total: the number of samples whose features will be formed (for the memory in the warning).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if x.dtype != params[0].dtype:
        raise TypeError(f"inputs have dtype {x.dtype} but the model's parameters are {params[0].dtype}")
    if x.device != params[0].device:
        raise ValueError(f"inputs are on {x.device} but the model's parameters are on {params[0].device}")
    units = _units(model)
    recorder = _Recorder(units)
    probe = x[:2]
    with recorder.recording(), torch.enable_grad():
        try:
            out = recorder.run(model, probe)
        except ValueError:
            raise
        except Exception as err:  # the model's own shape errors, named as an input problem
            raise ValueError(
                f"model cannot be applied to inputs of shape (batch, {', '.join(map(str, x.shape[1:]))}): {err}"
            ) from err
        out = _flat_outputs(out, probe.shape[0])
        records = dict(recorder.records)
    _check_reached(units, records, out)
    k = out.shape[1]
    ran = [u for u in units if u.name in records]
    implicit, explicit, work = [], 0, k
    for u in ran:
        args, _, z = records[u.name]
        work += sum(a[0].numel() for a in args if isinstance(a, Tensor)) + (k + 1) * z[0].numel()
        if u.kind == "linear":
            a = args[0]
            f_in, h = u.module.in_features, u.module.out_features
            if a.dim() == 2 and u.weight:
                implicit.append((f_in + int(u.bias), h))
            else:
                explicit += h * (f_in * int(u.weight) + int(u.bias))
        else:
            p = sum(t.numel() for t in u.params.values())
            explicit += p
            warnings.warn(
                f"lazykern.ntk: module {u.name!r} ({type(u.module).__name__}) has no factored NTK rule; "
                f"using explicit per-sample gradients of its {p} parameters "
                f"({total * k * p * x.element_size() / 2**20:.1f} MiB for {total} samples)",
                NTKFallbackWarning,
                stacklevel=4,
            )
    feature_numel = sum(f + k * h for f, h in implicit) + k * explicit
    return NetworkInfo(
        units=ran,
        num_outputs=k,
        num_params=sum(p.numel() for p in params),
        sample_shape=tuple(x.shape[1:]),
        dtype=x.dtype,
        device=x.device,
        feature_numel=feature_numel,
        implicit_dims=implicit,
        explicit_dim=explicit,
        work_numel=work + feature_numel,
    )


def _check_reached(units: list[_Unit], records: dict, out: Tensor) -> None:
    """A module whose forward never ran but whose parameters reach the output is used functionally
    (e.g. a parent reads ``child.weight``): its contribution would be silently lost, so refuse."""
    owners = [(u, p) for u in units if u.name not in records for p in _trainable_own(u.module).values()]
    if owners and out.requires_grad:
        grads = torch.autograd.grad(out.sum(), [p for _, p in owners], allow_unused=True)
        for (u, _), g in zip(owners, grads):
            if g is not None:
                raise ValueError(
                    f"the parameters of module {u.name!r} affect the output without its forward being "
                    "called (used functionally by a parent module); not supported"
                )
    if not any(u.name in records for u in units):
        raise ValueError("none of the model's trainable parameters affects its output")


def batch_size(info: NetworkInfo, total: int) -> int:
    """Samples per extraction batch, so activations, cotangents and graph stay near ``chunk_bytes``."""
    # x3: the autograd graph keeps roughly another copy of the activations.
    per_sample = 3 * info.work_numel * torch.empty((), dtype=info.dtype).element_size()
    return int(min(total, max(1, settings.chunk_bytes.value() // per_sample)))


def _per_sample_grads(unit: _Unit, args: tuple, kwargs: dict, cot: Tensor) -> Tensor:
    """Explicit per-sample gradients ``(B, k, P)`` of one module's own parameters, via torch.func."""
    params = {n: p.detach() for n, p in unit.params.items()}
    in_dims = tuple(0 if isinstance(a, Tensor) else None for a in args)
    args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)

    def one(g_b: Tensor, *args_b: object) -> dict[str, Tensor]:
        def f(p: dict[str, Tensor]) -> Tensor:
            batched = tuple(a.unsqueeze(0) if isinstance(a, Tensor) else a for a in args_b)
            return functional_call(unit.module, p, batched, kwargs)

        _, pullback = vjp(f, params)
        return vmap(pullback)(g_b.unsqueeze(1))[0]

    grads = vmap(one, in_dims=(0, *in_dims))(cot.transpose(0, 1), *args)
    b, k = cot.shape[1], cot.shape[0]
    return torch.cat([grads[n].reshape(b, k, -1) for n in params], dim=-1)


def _batch_features(model: nn.Module, recorder: _Recorder, info: NetworkInfo, x: Tensor) -> Features:
    k = info.num_outputs
    out = _flat_outputs(recorder.run(model, x), x.shape[0])
    records = recorder.records
    zs = [records[u.name][2] for u in info.units]
    eye = torch.eye(k, dtype=out.dtype, device=out.device)
    cot = eye.unsqueeze(1).expand(k, x.shape[0], k)
    cots = torch.autograd.grad(out, zs, grad_outputs=cot, is_grads_batched=True, allow_unused=True)
    factored: list[tuple[Tensor | None, Tensor]] = []
    explicit: list[Tensor] = []
    for u, g in zip(info.units, cots):
        args, kwargs, z = records[u.name]
        if g is None:
            g = torch.zeros((k, *z.shape), dtype=z.dtype, device=z.device)
        g = g.detach()
        if u.kind == "fallback":
            explicit.append(_per_sample_grads(u, args, kwargs, g))
            continue
        a = args[0].detach()
        if a.dim() == 2 and u.weight:
            if u.bias:
                a = torch.cat([a, torch.ones_like(a[:, :1])], dim=1)
            factored.append((a, g.transpose(0, 1)))
            continue
        a = a.reshape(a.shape[0], -1, a.shape[-1])  # (B, T, F)
        g = g.reshape(k, a.shape[0], -1, g.shape[-1])  # (k, B, T, H)
        parts = []
        if u.weight:
            parts.append(torch.einsum("kbth,btf->bkhf", g, a).reshape(a.shape[0], k, -1))
        if u.bias:
            parts.append(g.sum(2).transpose(0, 1))
        explicit.append(torch.cat(parts, dim=-1))
    if explicit:
        factored.append((None, torch.cat(explicit, dim=-1)))
    return Features(factored)


def stream(model: nn.Module, info: NetworkInfo, x: Tensor, consume: Callable[[slice, Features], None]) -> None:
    """Call ``consume(rows, features)`` for each sample batch of ``x``; hooks are removed on return
    and on error (a callback rather than a generator, so no suspended generator keeps them)."""
    n = x.shape[0]
    step = batch_size(info, n)
    recorder = _Recorder(info.units)
    with recorder.recording(), torch.enable_grad():
        for start in range(0, n, step):
            rows = slice(start, min(n, start + step))
            consume(rows, _batch_features(model, recorder, info, x[rows]))


def extract(model: nn.Module, info: NetworkInfo, x: Tensor) -> Features:
    """All features of ``x`` (``info.feature_numel`` numbers per sample)."""
    parts: list[Features] = []
    stream(model, info, x, lambda rows, f: parts.append(f))
    return Features.cat(parts)


def feature_bytes(info: NetworkInfo, n: int) -> int:
    return n * info.feature_numel * torch.empty((), dtype=info.dtype).element_size()

