r"""lazykern's C toolchain: compile C sources with a C compiler into a cache folder and load them with ``ctypes``.

The engines that run C on the CPU share it: the CPU engine's generated reductions
(:mod:`lazykern.cpu`, :func:`load_source`) and the C files written by hand next to the modules
that load them (:mod:`lazykern.structured`, :mod:`lazykern.cpu.dense_matmul`: :func:`load_file`).
Every program includes ``lazykern.h``, the header of this folder (:data:`INCLUDE_FOLDER`): the C
that any program may use (flush-to-zero, the clamp of ``exp``, ``LK_INLINE``). One
shared library per program, named by a hash of its source and of the headers of its include
folders (so, for a generated reduction, the expression graph, its bindings and outputs, the
dtype, and the generator itself; a changed header rebuilds what includes it), in the folder
:func:`cache_folder` gives for the whole flag set, compiler and CPU model (a shared cache never
serves one CPU's code to another). Parameter *values* are runtime arguments, never part of the key.

The settings are lazykern's own, read at each compile (KeOps' ``LAZYKERN_KEOPS_*`` variables
govern only lazykern's KeOps reductions, :mod:`lazykern.keops`):

* ``LAZYKERN_CPU_FLAGS``: extra compiler flags, replacing :data:`VECTOR_MATH_FLAGS` (an empty
  string compiles with :data:`BASE_FLAGS` alone); see :func:`extra_flags`;
* ``LAZYKERN_CPU_CACHE``: the cache base folder (default ``$XDG_CACHE_HOME/lazykern/cpu-engine``,
  i.e. ``~/.cache/lazykern/cpu-engine``); each flag set gets its own sub-folder;
* ``CXX``: the compiler (default ``g++``, which compiles the engine's C as C: ``-x c``).

``-ffast-math`` is never used: loading a library linked with ``crtfastmath.o`` turns on
flush-to-zero in the whole process.

The source is C with C headers only (no torch, pybind11 or C++ standard library headers), so a
reduction compiles in about a second. A file lock per library makes concurrent processes wait for one compile; the library is
written under a temporary name and renamed into place, so a reader never sees half a file.

Example:
    >>> os.path.basename(cache_folder()).startswith("flags-"), engine_flags().startswith(BASE_FLAGS)
    (True, True)
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import time
from _ctypes import CFuncPtr  # ctypes' class of a loaded C function (ctypes._CFuncPtr), by its public name

from ..cache_paths import CPU_CACHE_ENV, cpu_cache, cpu_model
from ..compiler.programs import Programs

__all__ = [
    "BASE_FLAGS", "VECTOR_MATH_FLAGS", "FLAGS_ENV", "CACHE_ENV", "INCLUDE_FOLDER", "cache_folder", "command",
    "compiler", "engine_flags", "extra_flags", "load_file", "load_source", "loaded_programs", "compile_log",
]

#: Flags of every reduction, before :func:`extra_flags`. ``-O2``: the loops that matter are
#: ``omp simd`` loops, vectorized at ``-O2`` too, and ``-O3`` only compiled slower (measured:
#: docs/cpu_engine.rst, "How it works"). ``-ffp-contract=off``:
#: GCC's GNU C default fuses ``a * b - c`` into one FMA, which rounds differently from the torch
#: engine and KeOps; where a formula cancels (OAK's terms at a collapsed lengthscale, products of
#: 1e9 minus 1e9), the fused result differed by 128 and overflowed an ``expm1`` that the other
#: engines kept finite.
BASE_FLAGS = "-x c -std=gnu11 -O2 -ffp-contract=off -fopenmp -fPIC -shared"

#: Default extra flags, for the widest vector instructions of the running CPU (``-march=native``)
#: and glibc's vector ``exp``/``log``/``sin`` (a few ulp) in ``omp simd`` loops. ``-D__FAST_MATH__``
#: makes ``math.h`` declare them, ``-fno-math-errno -fno-trapping-math`` let GCC call them, IEEE
#: semantics otherwise kept (the generated C includes ``math.h`` and calls ``expf`` for float).
VECTOR_MATH_FLAGS = "-march=native -fno-math-errno -fno-trapping-math -D__FAST_MATH__"

#: The folder of ``lazykern.h``, the header every program includes, searched first (``-I``).
INCLUDE_FOLDER = os.path.dirname(os.path.abspath(__file__))

FLAGS_ENV = "LAZYKERN_CPU_FLAGS"
CACHE_ENV = CPU_CACHE_ENV  # named with the other engines' folders, in lazykern.cache_paths

_LOCK_TIMEOUT_S = 1800
_programs = Programs()  # by source text and include folders, or by file and defines
_libraries: set[str] = set()  # the shared libraries loaded, one per program whatever its symbols

#: (library name, seconds) of each compile this process ran, for reports and benchmarks.
compile_log: list[tuple[str, float]] = []


def compiler() -> str | None:
    """The compiler's path: ``$CXX``, else ``g++``, when on ``PATH`` (``None`` otherwise).

    Example:
        >>> compiler() is None or os.path.isabs(compiler())
        True
    """
    return shutil.which(os.environ.get("CXX") or "g++")


def extra_flags() -> str:
    """The engine's extra compiler flags: ``LAZYKERN_CPU_FLAGS`` if set (whitespace normalized),
    else :data:`VECTOR_MATH_FLAGS`.

    Example:
        >>> os.environ[FLAGS_ENV] = "  -O2   -g "
        >>> extra_flags()
        '-O2 -g'
        >>> del os.environ[FLAGS_ENV]
        >>> extra_flags() == VECTOR_MATH_FLAGS
        True
    """
    if FLAGS_ENV in os.environ:
        return " ".join(os.environ[FLAGS_ENV].split())
    return VECTOR_MATH_FLAGS


def engine_flags() -> str:
    """The whole flag string of the engine's compiles (part of the cache folder's key).

    Example:
        >>> engine_flags().startswith(BASE_FLAGS)
        True
    """
    return f"{BASE_FLAGS} {extra_flags()}".strip()


def cache_folder(flags: str | None = None) -> str:
    """The folder of the libraries compiled with ``flags`` (default :func:`engine_flags`):
    ``<base>/flags-<hash of flags, compiler, CPU model>``, ``<base>`` being ``LAZYKERN_CPU_CACHE``
    or ``$XDG_CACHE_HOME/lazykern/cpu-engine`` (:func:`lazykern.cache_paths.cpu_cache`). Deleting it is safe: reductions are recompiled.

    Example:
        >>> cache_folder("-O2") == cache_folder(" -O2 "), cache_folder("-O2") == cache_folder("-O3")
        (True, False)
    """
    flags = engine_flags() if flags is None else " ".join(flags.split())
    identity = f"flags={flags}\ncompiler={compiler()}\ncpu={cpu_model()}\n"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    return os.path.join(cpu_cache(), f"flags-{digest}")


def loaded_programs() -> int:
    """How many distinct compiled programs this process has loaded so far (compiled by it, or read
    from the cache folder).

    Example:
        >>> loaded_programs() >= 0
        True
    """
    return len(_libraries)


def load_source(source: str, symbol: str, argtypes: list) -> CFuncPtr:
    """The function ``symbol`` of the C ``source``, compiled on first use, then cached on disk and in
    memory (``argtypes``: its ``ctypes`` argument types; it returns nothing). ``#include
    "lazykern.h"`` finds the header of :data:`INCLUDE_FOLDER`.

    Example:
        >>> twice = load_source('#include "lazykern.h"\\nvoid lk_twice(double *x) { x[0] *= 2; }', "lk_twice",
        ...                     [ctypes.c_void_p])
        >>> x = (ctypes.c_double * 1)(21.0)
        >>> twice(x); x[0]
        42.0
    """
    return _programs.get((source, symbol), lambda: _load_or_compile(source, (INCLUDE_FOLDER,), symbol, argtypes))


def load_file(path: str, symbol: str, argtypes: list, defines: dict[str, str] | None = None) -> CFuncPtr:
    """The function ``symbol`` of the C file ``path``, as :func:`load_source` with the file's own
    folder searched for headers after :data:`INCLUDE_FOLDER`, and each of ``defines`` a ``#define
    NAME VALUE`` line before the file's text (what a file leaves to its caller, such as an element
    type). The file is read once per process.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "scale.c")
        >>> with open(path, "w") as f:
        ...     _ = f.write('#include "lazykern.h"\\nvoid lk_scale(double *x) { x[0] *= FACTOR; }\\n')
        >>> scale = load_file(path, "lk_scale", [ctypes.c_void_p], {"FACTOR": "0.5"})
        >>> x = (ctypes.c_double * 1)(84.0)
        >>> scale(x); x[0]
        42.0
    """
    definitions = tuple((defines or {}).items())

    def build() -> CFuncPtr:
        with open(path, encoding="utf-8") as f:
            text = "".join(f"#define {name} {value}\n" for name, value in definitions) + f.read()
        return _load_or_compile(text, (INCLUDE_FOLDER, os.path.dirname(os.path.abspath(path))), symbol, argtypes)

    return _programs.get((path, definitions, symbol), build)


def command(source_file: str, lib: str, flags: str, include: tuple[str, ...]) -> list[str]:
    """The compiler's command line that builds the shared library ``lib`` from the C file
    ``source_file`` with ``flags``, searching the folders ``include`` for headers in that order; a
    ``RuntimeError`` where there is no :func:`compiler`.

    Example:
        >>> command("a.c", "a.so", "-O2", ("/h",))[1:]
        ['-O2', '-I/h', 'a.c', '-o', 'a.so', '-lm']
    """
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("lazykern's CPU engines need a C compiler on PATH: $CXX, else g++")
    return [cxx, *flags.split(), *(f"-I{folder}" for folder in include), source_file, "-o", lib, "-lm"]


def _key(source: str, include: tuple[str, ...]) -> str:
    """The hash of ``source`` and of the name and text of every header of the folders ``include``
    (a few small files; a program that includes only some of them recompiles more often than it
    must, never less). Not their paths: two copies of lazykern share the libraries they agree on."""
    digest = hashlib.sha256(source.encode())
    for folder in include:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".h"):
                with open(os.path.join(folder, name), "rb") as f:
                    digest.update(f"\0{name}\0".encode() + f.read())
    return digest.hexdigest()[:24]


def _load_or_compile(source: str, include: tuple[str, ...], symbol: str, argtypes: list) -> CFuncPtr:
    # Keyed by the source and its headers: a change of the code generator or of a header can never
    # load a stale library.
    key = _key(source, include)
    from filelock import FileLock, Timeout

    flags = engine_flags()
    folder = cache_folder(flags)
    os.makedirs(folder, exist_ok=True)
    lib = os.path.join(folder, f"lk_{key}.so")
    if not os.path.exists(lib):
        lock = FileLock(os.path.join(folder, f".lk_{key}.lock"), timeout=_LOCK_TIMEOUT_S)
        try:
            with lock:
                if not os.path.exists(lib):
                    _compile(source, include, flags, lib)
        except Timeout as err:
            raise RuntimeError(
                f"lazykern waited {_LOCK_TIMEOUT_S} s for another process compiling {lib}; if none is "
                f"running, delete {lock.lock_file}"
            ) from err
    fn = getattr(ctypes.CDLL(lib), symbol)
    _libraries.add(lib)
    fn.restype = None
    fn.argtypes = argtypes
    return fn


def _compile(source: str, include: tuple[str, ...], flags: str, lib: str) -> None:
    src = lib[:-3] + ".c"
    tmp_src, tmp_lib = f"{lib[:-3]}.{os.getpid()}.tmp.c", f"{lib}.{os.getpid()}.tmp"
    cmd = command(src, tmp_lib, flags, include)  # first: it raises where there is no compiler
    with open(tmp_src, "w") as f:
        f.write(source)
    os.replace(tmp_src, src)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {src} failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    os.replace(tmp_lib, lib)
    compile_log.append((os.path.basename(lib), time.perf_counter() - start))
