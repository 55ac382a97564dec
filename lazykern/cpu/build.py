r"""Compile generated reductions with ``g++`` into a cache folder and load them with ``ctypes``.

One shared library per :class:`~lazykern.cpu.codegen.Reduction`, named by a hash of its generated
source (so the expression graph, its bindings and outputs, the dtype, and the generator itself), in
the folder
:func:`lazykern.keops.build_folder` gives for the engine's full flag set (so the folder also
changes with the flags, the compiler and the CPU model, exactly as for lazykern's KeOps
reductions). Parameter *values* are runtime arguments, never part of the key.

Flags: :data:`BASE_FLAGS` plus :func:`lazykern.keops.compile_flags` (``-march=native`` and the
switches that let glibc's vector ``exp``/``log``/``sin`` be called without ``-ffast-math``; the
same opt-out, ``LAZYKERN_KEOPS_FLAGS``, applies). ``-ffast-math`` is never used: loading a library
linked with ``crtfastmath.o`` turns on flush-to-zero in the whole process.

The source is C with C headers only (no torch, pybind11 or C++ standard library headers), so a
reduction compiles in about a second. A file lock per library makes concurrent processes wait for one compile; the library is
written under a temporary name and renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
import time

from .. import keops
from .codegen import Reduction, generate

__all__ = ["BASE_FLAGS", "compiler", "engine_flags", "load", "load_source", "compile_log"]

#: Flags of every reduction, before :func:`lazykern.keops.compile_flags`. ``-O2``: the loops that
#: matter are ``omp simd`` loops, vectorized at ``-O2`` too; ``-O3`` measured no faster (additive RBF,
#: d = 26, products and fused gradients) and took twice as long to compile. ``-ffp-contract=off``:
#: GCC's GNU C default fuses ``a * b - c`` into one FMA, which rounds differently from the torch
#: engine and KeOps; where a formula cancels (OAK's terms at a collapsed lengthscale, products of
#: 1e9 minus 1e9), the fused result differed by 128 and overflowed an ``expm1`` that the other
#: engines kept finite.
BASE_FLAGS = "-x c -std=gnu11 -O2 -ffp-contract=off -fopenmp -fPIC -shared"

_LOCK_TIMEOUT_S = 1800
_loaded: dict[object, ctypes._CFuncPtr] = {}  # by Reduction, or by source text
_lock = threading.Lock()

#: (library name, seconds) of each compile this process ran, for reports and benchmarks.
compile_log: list[tuple[str, float]] = []


def compiler() -> str | None:
    """The compiler KeOps is configured with (``g++``, which builds the engine's C as C), when on ``PATH``."""
    from keopscore.config import config

    cxx = config.get_cxx_compiler() or "g++"
    return shutil.which(cxx)


def engine_flags() -> str:
    """The whole flag string of the engine's compiles (part of the cache folder's key).

    Example:
        >>> engine_flags().startswith(BASE_FLAGS)
        True
    """
    return f"{BASE_FLAGS} {keops.compile_flags()}".strip()


_REDUCE_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 6


def load(red: Reduction) -> ctypes._CFuncPtr:
    """The compiled function of ``red`` (compiled on first use, then cached on disk and in memory)."""
    return _load_cached(red, lambda: _load_or_compile(generate(red), "lk_reduce", _REDUCE_ARGTYPES))


def load_source(source: str, symbol: str, argtypes: list) -> ctypes._CFuncPtr:
    """The function ``symbol`` of a fixed C ``source`` (compiled and cached like a reduction)."""
    return _load_cached(source, lambda: _load_or_compile(source, symbol, argtypes))


def _load_cached(key: object, make) -> ctypes._CFuncPtr:
    fn = _loaded.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _loaded.get(key)
        if fn is None:
            fn = _loaded[key] = make()
    return fn


def _load_or_compile(source: str, symbol: str, argtypes: list) -> ctypes._CFuncPtr:
    # Keyed by the source itself: a change of the code generator can never load a stale library.
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    from filelock import FileLock, Timeout

    flags = engine_flags()
    folder = os.path.join(keops.build_folder(flags), "cpu-engine")
    os.makedirs(folder, exist_ok=True)
    lib = os.path.join(folder, f"lk_{key}.so")
    if not os.path.exists(lib):
        lock = FileLock(os.path.join(folder, f".lk_{key}.lock"), timeout=_LOCK_TIMEOUT_S)
        try:
            with lock:
                if not os.path.exists(lib):
                    _compile(source, flags, lib)
        except Timeout as err:
            raise RuntimeError(
                f"lazykern waited {_LOCK_TIMEOUT_S} s for another process compiling {lib}; if none is "
                f"running, delete {lock.lock_file}"
            ) from err
    fn = getattr(ctypes.CDLL(lib), symbol)
    fn.restype = None
    fn.argtypes = argtypes
    return fn


def _compile(source: str, flags: str, lib: str) -> None:
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("lazykern's CPU engine needs a C++ compiler (g++) on PATH")
    src = lib[:-3] + ".c"
    tmp_src, tmp_lib = f"{lib[:-3]}.{os.getpid()}.tmp.c", f"{lib}.{os.getpid()}.tmp"
    with open(tmp_src, "w") as f:
        f.write(source)
    os.replace(tmp_src, src)
    cmd = [cxx, *flags.split(), src, "-o", tmp_lib, "-lm"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {src} failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    os.replace(tmp_lib, lib)
    compile_log.append((os.path.basename(lib), time.perf_counter() - start))
