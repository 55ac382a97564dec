r"""Everything lazykern does with KeOps, one module per job:

* :mod:`lazykern.keops.versions`: the pykeops/keopscore versions lazykern's hooks were verified on;
* ``lazykern.keops.session``: the compile session (lazykern's flags and cache folder for its own
  reductions, under a lock; ``LazyTensor`` wrapping, size padding);
* :mod:`lazykern.keops.discovery`: torch's pip-wheel CUDA made visible to keopscore;
* :mod:`lazykern.keops.nvrtc`: KeOps' NVRTC engine rebuilt with ``--no-cache`` on NVRTC >= 13;
* :mod:`lazykern.keops.health`: the GPU health check in a subprocess, and its verdicts on disk;
* :mod:`lazykern.keops.nodes`: lazykern's own KeOps formula nodes (elementary symmetric
  polynomials, ``expm1``) and their registry;
* :mod:`lazykern.keops.engine`: the KeOps engine itself (``ENGINE``, the package's face to the
  chooser), products and fused gradients of a formula.

KeOps' printed messages are no part of the engine (GPyTorch imports KeOps whatever engine runs):
``lazykern.keops_messages`` sends them to stderr. The compile session's names are importable
from the package (``from lazykern.keops import keops_session``). They are loaded on first use
(PEP 562), so that the modules that need neither torch nor KeOps (the version checks, CUDA
discovery, the health check's verdicts) import neither.

Example:
    >>> import lazykern.keops as lk
    >>> lk.padded_size(3), lk.padded_size(17)
    (4, 32)
"""

from __future__ import annotations

import importlib
from typing import Any

_SESSION = (
    "CACHE_ENV", "FAST_FLAGS", "FLAGS_ENV", "PATCHED_VERSIONS", "VERSION_PROBLEM", "build_folder", "compile_flags",
    "keops_lazy_tensor", "keops_session", "loaded_reductions", "padded_size",
)
#: Each name the package exports, by the module that defines it.
_ORIGIN = {"ENGINE": ".engine", **{name: ".session" for name in _SESSION}}

__all__ = list(_ORIGIN)


def __getattr__(name: str) -> Any:
    if name not in _ORIGIN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_ORIGIN[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
