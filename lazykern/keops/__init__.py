r"""Everything lazykern does with KeOps, one module per job:

* :mod:`lazykern.keops.versions`: the pykeops/keopscore versions lazykern's hooks were verified on;
* ``lazykern.keops.session``: the compile session (lazykern's flags and cache folder for its own
  reductions, under a lock; ``LazyTensor`` wrapping, size padding);
* :mod:`lazykern.keops.discovery`: torch's pip-wheel CUDA made visible to keopscore;
* :mod:`lazykern.keops.nvrtc`: KeOps' NVRTC engine rebuilt with ``--no-cache`` on NVRTC >= 13;
* :mod:`lazykern.keops.health`: the GPU health check in a subprocess, and its verdicts on disk;
* :mod:`lazykern.keops.nodes`: lazykern's own KeOps formula nodes (elementary symmetric
  polynomials, ``expm1``);
* :mod:`lazykern.keops.engine`: the KeOps engine itself, products and fused gradients of a formula;
* ``lazykern.keops.messages``: KeOps' printed messages sent to stderr.

The compile session's names are importable from the package (``from lazykern.keops import
keops_session``). They are loaded on first use (PEP 562): ``import lazykern`` installs the message
hook of ``lazykern.keops.messages`` and must not import torch or KeOps for it.

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

__all__ = list(_SESSION)


def __getattr__(name: str) -> Any:
    if name not in _SESSION:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".session", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
