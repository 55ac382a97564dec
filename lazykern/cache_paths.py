r"""Where lazykern's engines keep what they build: one folder per engine, each with its own variable.

Every engine may import this module (it imports the standard library only, and no engine): the
folders are named here so that no engine has to ask another where its files go.

* ``LAZYKERN_CPU_CACHE``: the CPU engine's compiled libraries (:mod:`lazykern.native`), default
  ``$XDG_CACHE_HOME/lazykern/cpu-engine``, i.e. ``~/.cache/lazykern/cpu-engine``;
* ``LAZYKERN_TRITON_CACHE``: the Triton engine's generated kernel sources
  (``lazykern.triton.build``), default ``$XDG_CACHE_HOME/lazykern/triton-engine``;
* ``LAZYKERN_KEOPS_CACHE``: lazykern's KeOps reductions, its CUDA shim, NVRTC engine and GPU health
  verdicts (:mod:`lazykern.keops`), default ``<KeOps cache folder>/lazykern``, i.e.
  ``~/.cache/keops2.3/lazykern`` (beside KeOps' own builds, which it also names by its version).

Each folder may be deleted at any time: what was in it is built again on first use.

Example:
    >>> import os
    >>> os.environ[TRITON_CACHE_ENV] = "/tmp/lk-triton"
    >>> triton_cache()
    '/tmp/lk-triton'
    >>> del os.environ[TRITON_CACHE_ENV]
    >>> triton_cache().endswith(os.path.join("lazykern", "triton-engine"))
    True
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

__all__ = [
    "CPU_CACHE_ENV", "KEOPS_CACHE_ENV", "TRITON_CACHE_ENV", "cpu_cache", "cpu_model", "keops_cache", "triton_cache",
]

CPU_CACHE_ENV = "LAZYKERN_CPU_CACHE"
TRITON_CACHE_ENV = "LAZYKERN_TRITON_CACHE"
KEOPS_CACHE_ENV = "LAZYKERN_KEOPS_CACHE"


def _lazykern_cache(env: str, name: str) -> str:
    """``$env``, else ``$XDG_CACHE_HOME/lazykern/<name>`` (``~/.cache`` without ``XDG_CACHE_HOME``)."""
    base = os.environ.get(env) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "lazykern", name
    )
    return os.path.expanduser(base)


def cpu_cache() -> str:
    """The CPU engine's base folder: ``LAZYKERN_CPU_CACHE``, else ``$XDG_CACHE_HOME/lazykern/cpu-engine``
    (each flag set gets a sub-folder of it, :func:`lazykern.native.cache_folder`).

    Example:
        >>> os.path.isabs(cpu_cache())
        True
    """
    return _lazykern_cache(CPU_CACHE_ENV, "cpu-engine")


def triton_cache() -> str:
    """The Triton engine's folder of generated kernel sources: ``LAZYKERN_TRITON_CACHE``, else
    ``$XDG_CACHE_HOME/lazykern/triton-engine`` (Triton keeps its compiled binaries in ``~/.triton``).

    Example:
        >>> os.path.isabs(triton_cache())
        True
    """
    return _lazykern_cache(TRITON_CACHE_ENV, "triton-engine")


def keops_cache() -> str:
    """lazykern's KeOps folder, read without importing keopscore (whose import looks for CUDA):
    ``LAZYKERN_KEOPS_CACHE``, else ``<KEOPS_CACHE_FOLDER or ~/.cache/keops<keopscore version>>/lazykern``.

    Example:
        >>> os.path.isabs(keops_cache())
        True
    """
    base = os.environ.get(KEOPS_CACHE_ENV)
    if not base:
        try:
            version = metadata.version("keopscore")
        except metadata.PackageNotFoundError:
            version = ""
        keops = os.environ.get("KEOPS_CACHE_FOLDER") or os.path.join("~", ".cache", f"keops{version}")
        base = os.path.join(keops, "lazykern")
    return os.path.expanduser(base)


def cpu_model() -> str:
    """The CPU model and its instruction-set flags (what ``-march=native`` compiles for), from
    ``/proc/cpuinfo``; else the platform's processor or machine name. Part of the name of every
    folder of code compiled for this CPU, so a shared cache never serves one CPU's code to another.

    Example:
        >>> isinstance(cpu_model(), str) and cpu_model() != ""
        True
    """
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags", "Features", "CPU part") and key not in found:
                    found[key] = value.strip()
    except OSError:
        pass
    return "; ".join(f"{k}: {v}" for k, v in found.items()) or platform.processor() or platform.machine()
