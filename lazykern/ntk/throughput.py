r"""The throughputs ``backend="auto"`` compares, measured on the device it runs on.

Three short timed probes, each run once per (device, dtype) and process and cached:

* ``dense``: a pairwise block of :func:`lazykern.backend.pairwise_dense` with a dot-product NTK
  formula (the torch engine's matrix products), 512 x 1024 pairs of 256-vectors;
* ``network``: forward and backward passes through a small two-layer network (what feature
  extraction and the linearized backend spend their time on), batch 256, width 256;
* ``keops``: one KeOps reduction of the factored NTK formula (32-vector rows), 512 x 512 pairs on
  a CPU and 8192 x 8192 on a GPU; measured only when KeOps is a candidate (its first use on a
  machine compiles the formula, once, into KeOps' cache).

Each rate is the median of three timed runs after one untimed run, in multiply-adds per second.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn

from .. import backend
from ..formulas.ntk import NTKFormula, NTKPart
from ..timing import synchronize

__all__ = ["Rates", "measured_rates", "synchronize"]


@dataclass(frozen=True)
class Rates:
    """Multiply-adds per second on one device and dtype; ``keops`` is ``None`` until measured."""

    dense: float
    network: float
    keops: float | None = None


_cache: dict[tuple, Rates] = {}
_lock = threading.Lock()


def _rate(work: float, fn: Callable[[], object], device: torch.device) -> float:
    fn()
    synchronize(device)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return work / max(statistics.median(times), 1e-9)


def _dense_rate(device: torch.device, dtype: torch.dtype) -> float:
    g = torch.Generator(device="cpu").manual_seed(0)
    x1 = torch.randn(512, 256, generator=g, dtype=dtype).to(device)
    x2 = torch.randn(1024, 256, generator=g, dtype=dtype).to(device)
    formula = NTKFormula((NTKPart(None, (0, 256), "one"),))
    return _rate(512 * 1024 * 256, lambda: backend.pairwise_dense(formula, x1, x2, {}), device)


def _network_rate(device: torch.device, dtype: torch.dtype) -> float:
    # The layers draw their initial weights from the global generator: under fork_rng the user's
    # random stream continues afterwards as if the probe had never run.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256)).to(device=device, dtype=dtype)
    x = torch.randn(256, 256, generator=torch.Generator(device="cpu").manual_seed(0), dtype=dtype).to(device)

    def step() -> None:
        with torch.enable_grad():
            torch.autograd.grad(net(x).square().sum(), list(net.parameters()))

    # forward 2 x 256^3; backward about twice that (activations and weights)
    return _rate(6 * 256**3, step, device)


def _keops_rate(device: torch.device, dtype: torch.dtype) -> float:
    n = 8192 if device.type == "cuda" else 512
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, 32, generator=g, dtype=dtype).to(device)
    v = torch.randn(n, 1, generator=g, dtype=dtype).to(device)
    formula = NTKFormula((NTKPart((0, 16), (16, 32)),))

    choice = backend.preferred("keops", device)  # the engine the "keops" backend will run

    def reduce() -> None:
        backend.pairwise_matmul(formula, x, x, {}, v, choice)

    return _rate(n * n * 33, reduce, device)


def measured_rates(device: torch.device, dtype: torch.dtype, *, keops: bool) -> Rates:
    """The cached rates of ``device`` and ``dtype``, probing what is missing (``keops``: also KeOps)."""
    key = (device.type, device.index, dtype)
    with _lock, torch.no_grad():
        rates = _cache.get(key)
        if rates is None:
            rates = Rates(_dense_rate(device, dtype), _network_rate(device, dtype))
        if keops and rates.keops is None:
            rates = replace(rates, keops=_keops_rate(device, dtype))
        _cache[key] = rates
    return rates
