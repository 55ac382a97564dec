r"""KeOps' NVRTC engine on NVRTC 13 and later, built with ``--no-cache``.

keopscore 2.3 compiles GPU reductions with NVRTC, through an engine library it builds itself
(``keopscore/binders/nvrtc/nvrtc_jit.cpp``). NVRTC 13 has a compile cache backed by the driver:
inside ``nvrtcCompileProgram`` it calls ``cuGetExportTable`` and dereferences NULL when the driver
hands back no table, and the Python process dies on the first formula (where it was seen:
docs/gpu.rst, "NVRTC 13 and the driver's compile cache").
NVRTC 13's option ``--no-cache`` skips that cache; NVRTC 12 rejects the option. On NVRTC >= 13
(:func:`needs_no_cache`), lazykern compiles a copy of ``nvrtc_jit.cpp`` with ``--no-cache`` in
every option list (:func:`patched_jit_source`) into its cache and makes keopscore load it, through
``keopscore.binders.nvrtc.Gpu_link_compile.jit_compile_dll`` (:func:`select_jit_engine`).

Example:
    >>> needs_no_cache((13, 0)), needs_no_cache((12, 8))
    (True, False)
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
import subprocess
import threading
from typing import Any, Sequence

from ..cache_paths import keops_cache
from .versions import VERSION_PROBLEM

__all__ = ["NO_CACHE_OPTIONS", "needs_no_cache", "nvrtc_version", "patched_jit_source", "select_jit_engine"]

#: The NVRTC options added to every compile of KeOps' engine on NVRTC >= 13 (see the module docstring).
NO_CACHE_OPTIONS = ("--no-cache",)

_lock = threading.Lock()
_engine_selected: list[str | None] = []


def needs_no_cache(version: tuple[int, int] | None) -> bool:
    """Whether KeOps' NVRTC engine must be built with :data:`NO_CACHE_OPTIONS` for this NVRTC
    ``(major, minor)`` version: NVRTC 13 and later (whose driver-backed cache can crash), never
    NVRTC 12 (which rejects ``--no-cache``) or an unknown version.

    Example:
        >>> needs_no_cache((13, 1)), needs_no_cache((12, 9)), needs_no_cache(None)
        (True, False, False)
    """
    return version is not None and version[0] >= 13


def patched_jit_source(source: str, options: Sequence[str] = NO_CACHE_OPTIONS) -> str:
    r"""``nvrtc_jit.cpp`` with ``options`` appended to the option list of every
    ``nvrtcCompileProgram`` call in it (and the option counts raised to match).

    keopscore 2.3's ``Compile()`` declares each list as ``const char *opts[] = {...};`` right before
    ``nvrtcCompileProgram(prog, <count>, opts)``: with the fast-math flag, without it, and a retry
    without the architecture flag. A source where some call does not have that shape is refused
    (``RuntimeError``), never half patched.

    Example:
        >>> src = 'const char *opts[] = {arch};\ncompileResult = nvrtcCompileProgram(prog,  // prog\n 1, opts);'
        >>> print(patched_jit_source(src))
        const char *opts[] = {arch, "--no-cache"};
        compileResult = nvrtcCompileProgram(prog,  // prog
         2, opts);
    """
    added = "".join(f', "{o}"' for o in options)
    # 1: the declaration up to "{" (2: the array's name), 3: its options, 4: up to the count,
    # 5: the count, 6: the array passed.
    pattern = re.compile(
        r"(const char \*(\w+)\[\] = \{)([^}]*)(\};\s*compileResult = nvrtcCompileProgram\(prog,\s*(?://[^\n]*)?\s*)"
        r"(\d+)(,\s*(?://[^\n]*)?\s*\2\))"
    )

    def rewrite(match: re.Match) -> str:
        head, _, opts, mid, count, tail = match.groups()
        return f"{head}{opts}{added}{mid}{int(count) + len(options)}{tail}"

    out, done = pattern.subn(rewrite, source)
    calls = source.count("nvrtcCompileProgram(")
    if calls == 0 or done != calls:
        raise RuntimeError(
            f"nvrtc_jit.cpp: {done} of {calls} nvrtcCompileProgram calls have keopscore 2.3's option-list shape; "
            "not patched"
        )
    return out


def nvrtc_version(folder: str | None = None) -> tuple[int, int] | None:
    """``(major, minor)`` of the NVRTC in ``folder`` (default: the one keopscore found), or ``None``.

    Example:
        >>> nvrtc_version("/nonexistent") is None
        True
    """
    if folder is None:
        from keopscore.config import cuda_config

        folder = cuda_config.get_libnvrtc_folder()
        if folder is None:
            return None
    names = sorted(glob.glob(os.path.join(folder, "libnvrtc.so*")), key=len)
    for path in names:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return major.value, minor.value
    return None


def select_jit_engine() -> str | None:
    """On NVRTC >= 13 (:func:`needs_no_cache`), build KeOps' NVRTC engine from
    :func:`patched_jit_source` into lazykern's cache (once; under a file lock) and make keopscore
    load it; returns its path, or ``None`` where KeOps' own engine is kept. Once per process.

    Example (NVRTC 13):
        >>> select_jit_engine()  # doctest: +SKIP
        '/root/.cache/keops2.3/lazykern/Linux_.../nvrtc-jit-3f2a9c01de/nvrtc_jit.so'
    """
    with _lock:
        if not _engine_selected:
            _engine_selected.append(_select_jit_engine())
        return _engine_selected[0]


def _select_jit_engine() -> str | None:
    if VERSION_PROBLEM is not None or not needs_no_cache(nvrtc_version()):
        return None
    import importlib

    from filelock import FileLock
    from keopscore.config import config

    # Imported by name (it needs CUDA to import); Any: keopscore ships no types, and one of its
    # functions is replaced below.
    glc: Any = importlib.import_module("keopscore.binders.nvrtc.Gpu_link_compile")
    with open(glc.jit_compile_src) as f:
        source = patched_jit_source(f.read())
    # The compile command carries the GPUs' properties and the CUDA folders: part of the identity.
    identity = source + glc.Gpu_link_compile.get_compile_command(sourcename="SOURCE", dllname="LIBRARY")
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    folder = os.path.join(keops_cache(), config.get_default_build_folder_name(), f"nvrtc-jit-{digest}")
    library = os.path.join(folder, os.path.basename(glc.jit_compile_dll()))
    os.makedirs(folder, exist_ok=True)
    with FileLock(os.path.join(folder, ".lock")):
        if not os.path.exists(library):
            src = os.path.join(folder, "nvrtc_jit.cpp")
            with open(src, "w") as f:
                f.write(source)
            tmp = f"{library}.{os.getpid()}.tmp"  # a killed build never leaves a truncated library
            _compile(glc.Gpu_link_compile.get_compile_command(sourcename=src, dllname=tmp), tmp)
            os.replace(tmp, library)
    # Gpu_link_compile.__init__ looks the function up by name at each compile.
    glc.jit_compile_dll = lambda: library
    return library


def _compile(command: str, output: str) -> None:
    """Run KeOps' compile command for its NVRTC engine; a failure raises ``RuntimeError`` with the
    compiler's first error (KeOps' own runner only prints it)."""
    proc = subprocess.run(command, shell=True, capture_output=True, text=True)
    if proc.returncode == 0 and os.path.exists(output):
        return
    errors = [line.strip() for line in proc.stderr.splitlines() if "error" in line]
    first = errors[0] if errors else f"exit status {proc.returncode}"
    hint = ("; torch's CUDA wheels lack headers of the CUDA toolkit that KeOps' engine includes (CUDA 13: "
            "pip install nvidia-cuda-crt nvidia-cuda-cccl)" if "No such file" in first else "")
    raise RuntimeError(f"g++ failed: {first[:300]}{hint}")


