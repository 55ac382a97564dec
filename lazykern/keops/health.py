r"""KeOps' GPU health check: one tiny compile and reduction in a subprocess, so a crash never kills the caller.

Before the first KeOps GPU compile of a process, one tiny compile and reduction runs in a
*subprocess* (``python -m lazykern.keops.health INDEX``); a crash there (a signal), a hang or a
wrong value becomes a :class:`Health` whose ``cause`` names it, and lazykern's engine choice
(:func:`lazykern.backend.engine_for`) uses another engine with one warning. The verdict is kept on
disk per driver, NVRTC, keopscore and GPU model (:func:`verdict_path`), so the probe runs once per
stack, not once per process. The check first sets KeOps up as the probe will run it: CUDA
discovery (:func:`lazykern.keops.discovery.configure`) and, on NVRTC >= 13, the patched NVRTC
engine (:func:`lazykern.keops.nvrtc.select_jit_engine`).

Importing the module costs the standard library only.

Example:
    >>> Health(True, "", {}).ok
    True
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from importlib import metadata
from typing import Any, Mapping

from ..cache_paths import keops_cache
from . import discovery, nvrtc
from .versions import VERSION_PROBLEM

__all__ = ["Health", "health", "require", "verdict_path"]

# The probe's whole budget: a fresh cache builds KeOps' NVRTC engine and its pybind11 binder (g++,
# up to a minute each on a slow machine) before the one NVRTC compile it is there for.
_PROBE_TIMEOUT_S = 300
# Bumped when what the probe checks changes: older verdicts on disk are then ignored.
_PROBE_REVISION = 1
_PROBE_OK = "LAZYKERN_KEOPS_PROBE_OK"
_PROBE_ENV = "LAZYKERN_KEOPS_PROBE"  # set in the probe's process

_lock = threading.RLock()
_verdicts: dict[int, "Health"] = {}


@dataclasses.dataclass(frozen=True)
class Health:
    """The verdict of KeOps' GPU health check.

    Attributes:
        ok: KeOps compiled and ran the probe's reduction and got the right value.
        cause: why KeOps cannot run on this GPU, one sentence (empty when ``ok``).
        stack: what the verdict is keyed by: driver, NVRTC, keopscore and GPU model.
        cached: read from the verdict file of an earlier check.

    Example:
        >>> Health(False, "KeOps' GPU compile crashed (SIGSEGV, signal 11) in a health check", {}).ok
        False
    """

    ok: bool
    cause: str
    stack: Mapping[str, str]
    cached: bool = False


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"




def _driver_version() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            found = re.search(r"Kernel Module\s+(\S+)", f.read())
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        value = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(value))
        return f"CUDA {value.value // 1000}.{value.value % 1000 // 10}"
    except (OSError, AttributeError):
        return "unknown"


def _stack(index: int) -> dict[str, str]:
    """What KeOps' GPU verdict depends on, for GPU ``index`` (after :func:`lazykern.keops.discovery.configure`)."""
    import torch

    version = nvrtc.nvrtc_version()
    return {
        "driver": _driver_version(),
        "nvrtc": "not found" if version is None else f"{version[0]}.{version[1]}",
        "keopscore": _version("keopscore"),
        "gpu": torch.cuda.get_device_name(index),
    }


def verdict_path(stack: Mapping[str, str]) -> str:
    """The file keeping the health verdict of one ``stack`` (driver, NVRTC, keopscore, GPU model).

    Example:
        >>> os.path.basename(verdict_path({"driver": "580.65", "nvrtc": "13.0", "keopscore": "2.3", "gpu": "H200"}))[:7]
        'health-'
    """
    identity = json.dumps({**stack, "revision": _PROBE_REVISION}, sort_keys=True)
    return os.path.join(keops_cache(), "gpu-health", f"health-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.json")


def _probe_command(index: int) -> list[str]:
    return [sys.executable, "-m", "lazykern.keops.health", str(index)]


def _run_probe(index: int) -> tuple[bool, str]:
    """Run the probe in a subprocess: ``(ok, cause)``, the cause naming a signal, a hang or the error."""
    env = {**os.environ, "KEOPS_VERBOSE": "0", _PROBE_ENV: "1"}
    try:
        proc = subprocess.run(_probe_command(index), capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return False, f"KeOps' GPU health check did not finish in {_PROBE_TIMEOUT_S} s"
    if proc.returncode < 0:
        import signal

        try:
            name = f"{signal.Signals(-proc.returncode).name}, "
        except ValueError:
            name = ""
        return False, f"KeOps' GPU compile crashed ({name}signal {-proc.returncode}) in a health check"
    if proc.returncode != 0 or _PROBE_OK not in proc.stdout:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        last = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        return False, f"KeOps' GPU health check failed: {last[:300]}"
    return True, ""


def health(device: Any = None) -> Health:
    """KeOps' GPU health on ``device`` (a CUDA ``torch.device``, index or ``None`` for the current
    one): from this process's memo, else the verdict file of its stack (:func:`verdict_path`), else
    a probe in a subprocess (one compile and reduction; 5 minutes at most), whose
    verdict is then written. Runs :func:`lazykern.keops.discovery.configure` and :func:`lazykern.keops.nvrtc.select_jit_engine` first, as the probe
    does, so the verdict is about the engine this process will use.

    Example (on a GPU):
        >>> health(0)  # doctest: +SKIP
        Health(ok=True, cause='', stack={'driver': '580.65.06', 'nvrtc': '13.0', 'keopscore': '2.3', 'gpu': 'NVIDIA H200'}, cached=True)
    """
    import torch

    index = device.index if isinstance(device, torch.device) else device
    if index is None or int(index) < 0:  # KeOps passes -1 for data on the host
        index = torch.cuda.current_device()
    index = int(index)
    with _lock:
        if index in _verdicts:
            return _verdicts[index]
        _verdicts[index] = verdict = _check(index)
        return verdict


def require(device: Any = None) -> None:
    """Raise one clear ``RuntimeError`` where KeOps cannot run on ``device`` (:func:`health`), instead
    of letting a KeOps GPU compile crash the process. A no-op inside the probe itself.

    Example (on a GPU where KeOps' compile crashes):
        >>> require(0)  # doctest: +SKIP
        Traceback (most recent call last):
        RuntimeError: KeOps' GPU compile crashed (SIGSEGV, signal 11) in a health check: KeOps cannot run on ...
    """
    if os.environ.get(_PROBE_ENV):
        return
    verdict = health(device)
    if not verdict.ok:
        gpu = verdict.stack.get("gpu")  # (none where keopscore could not even be set up)
        raise RuntimeError(
            f"{verdict.cause}: KeOps cannot run on this GPU{f' ({gpu})' if gpu else ''}; use "
            "lazykern.settings.engine('auto'), which picks an engine that can"
        )


def _check(index: int) -> Health:
    try:
        discovery.configure()
    except Exception as err:  # noqa: BLE001 - e.g. KeOps' engine build failing in keopscore's re-run detection
        return Health(False, f"keopscore could not be set up for the pip CUDA ({type(err).__name__}: {err})"[:500], {})
    from keopscore.config import cuda_config

    stack = _stack(index)
    if not cuda_config.get_use_cuda():
        reason = cuda_config.cuda_message or "no usable CUDA found"
        return Health(False, f"keopscore runs CPU only ({reason.rstrip('.')}; set CUDA_PATH to a CUDA toolkit)", stack)
    if VERSION_PROBLEM is None:
        try:
            nvrtc.select_jit_engine()
        except Exception as err:  # noqa: BLE001 - a failed build is a verdict, not a crash of the caller
            options = " ".join(nvrtc.NO_CACHE_OPTIONS)
            return Health(False, f"KeOps' NVRTC engine could not be built with {options} ({err})", stack)
    path = verdict_path(stack)
    try:
        with open(path) as f:
            saved = json.load(f)
        return Health(bool(saved["ok"]), str(saved["cause"]), stack, cached=True)
    except (OSError, ValueError, KeyError):
        pass
    ok, cause = _run_probe(index)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"ok": ok, "cause": cause, "stack": stack, "revision": _PROBE_REVISION}, f, indent=1)
    os.replace(tmp, path)
    return Health(ok, cause, stack)


def _probe(index: int) -> None:
    """The probe, run as ``python -m lazykern.keops.health INDEX``: lazykern's CUDA configuration,
    then one KeOps reduction compiled fresh (an integer in the formula no earlier probe used) on GPU
    ``index``, checked against torch; prints ``LAZYKERN_KEOPS_PROBE_OK`` on success."""
    import secrets

    discovery.configure()
    import torch

    nvrtc.select_jit_engine()
    from pykeops.torch import LazyTensor

    torch.cuda.set_device(index)
    x = torch.randn(200, 3, device="cuda", dtype=torch.float32)
    salt = 2 + secrets.randbelow(10**6)  # an IntCst: a formula, hence an NVRTC compile, of its own
    K = (-((LazyTensor(x[:, None, :]) - LazyTensor(x[None, :, :])) ** 2).sum(-1)).exp() * salt
    value = (K @ torch.ones(200, 1, device="cuda")).squeeze(-1) / salt
    dense = torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1)).sum(-1)
    error = float((value - dense).abs().max() / dense.abs().max())
    if not error < 1e-4:
        raise SystemExit(f"KeOps' GPU reduction gave a wrong value (relative error {error:.1e})")
    print(f"{_PROBE_OK} relative error {error:.1e}", flush=True)


if __name__ == "__main__":
    _probe(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
