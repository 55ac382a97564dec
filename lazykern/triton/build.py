r"""Generated Triton kernels as modules in a cache folder, loaded once per process.

``@triton.jit`` reads its function's source with :mod:`inspect`, so a generated kernel must live in
a real file: the source of each :class:`~lazykern.compiler.plan.Reduction` is written to
``lk_<hash of the source>.py`` in the Triton engine's folder (``LAZYKERN_TRITON_CACHE``, else
``$XDG_CACHE_HOME/lazykern/triton-engine``: :func:`lazykern.cache_paths.triton_cache`; not keyed by
CPU flags, which Triton does not use; written under a temporary name and renamed into place, so a
reader never sees half a file) and imported from there. The hash covers the graph, its bindings, the dtype and the generator
itself: a change of the generator never loads a stale kernel. Triton keeps its own cache of
compiled binaries (``~/.triton``); under ``TRITON_INTERPRET=1`` nothing is
compiled and the kernels run on CPU tensors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from typing import Any

from ..cache_paths import triton_cache
from ..compiler.plan import Reduction
from ..compiler.programs import Programs
from .codegen import generate

__all__ = ["folder", "interpreted", "load"]

_programs = Programs()


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``, read by Triton when a
    kernel is defined): on CPU tensors, exactly, slowly.

    Example:
        >>> isinstance(interpreted(), bool)
        True
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def folder() -> str:
    """The folder of the generated kernel sources (:func:`lazykern.cache_paths.triton_cache`)."""
    return triton_cache()


def load(red: Reduction) -> Any:  # a triton.JITFunction: Triton ships no type information
    """The ``@triton.jit`` kernel of ``red``, generated and imported on first use."""
    return _programs.get(red, lambda: _import(generate(red)))


def _import(source: str) -> Any:
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    where = folder()
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, f"lk_{digest}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"lazykern_triton_{digest}", path)
    assert spec is not None and spec.loader is not None  # a .py file: Python's source loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lk_reduce
