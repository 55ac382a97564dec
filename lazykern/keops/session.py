r"""lazykern's KeOps compile session: wrapping tensors, compile flags, cache folder, lock.

KeOps compiles every distinct reduction with ``g++`` the first time it runs. lazykern compiles its
own reductions with faster flags than KeOps' defaults, into a cache folder of their own, without
touching the KeOps configuration seen by any other code in the process:

* :func:`keops_session` marks the KeOps reductions created inside it as lazykern's (the mark rides
  in the reduction's options, so the *gradient* reductions that KeOps derives and compiles lazily
  during ``backward()``, outside any :func:`keops_session`, carry it too);
* when KeOps loads a marked reduction on the CPU, lazykern switches KeOps' compile flags and build
  folder for the duration of that load only, under a thread lock and a cross-process file lock
  (two processes compiling the same formula into the same folder wait for each other), and
  restores them afterwards. Unmarked reductions (any other KeOps code) are loaded exactly as KeOps
  would; GPU reductions are never compiled with lazykern's flags.

**Threads.** Every KeOps load (compile or import of a reduction's module, CPU or GPU, lazykern's or
not) goes through the same thread lock, so no other thread's KeOps load ever runs while lazykern's
flags and folder are switched in. Running reductions that are already loaded never reads them.
Not covered: code that reads ``keopscore.config`` directly from another thread during a lazykern
compile (e.g. ``pykeops.clean_pykeops()`` or ``keopscore.config.config.get_build_folder()``) sees
lazykern's folder, and ``sys.path`` starts with that folder for the duration of the load.

**Versions.** These hooks use private pykeops/keopscore internals, verified for the versions in
:data:`PATCHED_VERSIONS` (``pyproject.toml`` bounds pykeops and keopscore accordingly). With any
other installed version, importing this module warns once and lazykern's reductions compile
exactly as KeOps' own would (its flags, its cache folder).

**Flags.** :data:`FAST_FLAGS` (used by default on x86-64 Linux) make the exponentials, logs and
sines of a formula vectorize with glibc's SIMD math library, several times faster than KeOps'
default flags on an additive RBF reduction (measured: docs/performance.rst, "Compile flags"):

* ``-include math.h`` declares the ``float`` overloads of ``exp``, ``log``, ... in the global
  namespace, where KeOps' generated code calls them: without it ``exp(float)`` is evaluated by the
  ``double`` function;
* ``-D__FAST_MATH__`` is glibc's switch for declaring the SIMD variants of those functions
  (accurate to a few ulp), and ``-fno-math-errno -fno-trapping-math`` let GCC call them;
* ``-march=native`` uses the widest vector instructions of the running CPU (the cache folder
  name includes the CPU model, so a shared cache never serves one CPU's code to another).

``-ffast-math`` itself is as fast but deliberately **not** used: GCC < 13 links ``crtfastmath.o``
into shared libraries built with it, and loading such a library turns on flush-to-zero for the
whole process, silently changing every later float computation (torch's included). The flags
above keep IEEE semantics (no finite-math or reassociation assumptions); inputs are validated
finite anyway (:mod:`lazykern.validation`).

**Opt-out and cache.** Environment variables, read at each reduction (of KeOps only: lazykern's
own CPU engine has its own, ``LAZYKERN_CPU_FLAGS`` and ``LAZYKERN_CPU_CACHE``, :mod:`lazykern.native`):

* ``LAZYKERN_KEOPS_FLAGS``: extra compiler flags for lazykern's reductions, replacing
  :data:`FAST_FLAGS` (set it to an empty string for KeOps' default flags);
* ``LAZYKERN_KEOPS_CACHE``: the base cache folder (default ``<KeOps cache>/lazykern``, i.e.
  ``~/.cache/keops2.3/lazykern``); each flag set gets its own sub-folder, see :func:`build_folder`.

Example:
    >>> import lazykern.keops as lk
    >>> lk.compile_flags() in (lk.FAST_FLAGS, "")  # FAST_FLAGS on x86-64 Linux
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import sys
import threading
from typing import Any, Iterator

from torch import Tensor

from ..cache_paths import KEOPS_CACHE_ENV, cpu_model
from . import discovery
from .health import require
from .versions import PATCHED_VERSIONS, VERSION_PROBLEM

__all__ = [
    "FAST_FLAGS",
    "PATCHED_VERSIONS",
    "build_folder",
    "compile_flags",
    "keops_lazy_tensor",
    "keops_session",
    "loaded_reductions",
    "padded_size",
    "VERSION_PROBLEM",
    "CACHE_ENV",
    "FLAGS_ENV",
]

#: Extra ``g++`` flags for lazykern's KeOps reductions on x86-64 Linux (see the module docstring).
FAST_FLAGS = "-march=native -fno-math-errno -fno-trapping-math -D__FAST_MATH__ -include math.h"

FLAGS_ENV = "LAZYKERN_KEOPS_FLAGS"
CACHE_ENV = KEOPS_CACHE_ENV  # named with the other engines' folders, in lazykern.cache_paths

# Key added to a KeOps reduction's optional flags; its value is the reduction's extra compile flags.
_MARK = "lazykern_cpp_flags"
_LOCK_NAME = ".lazykern-compile.lock"
# A compile can take minutes on a loaded machine; waiting longer than this means a stuck process.
_LOCK_TIMEOUT_S = 1800

_session = threading.local()
_switch_lock = threading.RLock()
_install_lock = threading.Lock()
_installed = False


def keops_lazy_tensor(t: Tensor):
    """``t`` as a KeOps ``LazyTensor`` (made contiguous, as KeOps requires).

    Example:
        >>> import torch
        >>> type(keops_lazy_tensor(torch.randn(5, 1, 3))).__name__
        'LazyTensor'
    """
    from pykeops.torch import LazyTensor

    from .nodes import register

    register()  # lazykern's own nodes, before any formula can write their names
    return LazyTensor(t.contiguous())


def padded_size(n: int) -> int:
    """The size a KeOps vector dimension is zero-padded to: 1, 2, 4, 8, then multiples of 16.

    KeOps compiles one reduction per set of vector sizes; rounding sizes (right-hand-side columns,
    feature widths) up to this short ladder bounds the compiles that CG, Lanczos and varying widths
    would otherwise trigger. Zeros change neither sums nor dot products, and cost a multiply-add
    per pair against the exponentials of the kernel itself.
    """
    if n <= 8:
        return 1 << (n - 1).bit_length()
    return -(-n // 16) * 16


def compile_flags() -> str:
    """The extra compiler flags of lazykern's KeOps reductions on the CPU (lazykern's own CPU
    engine has its own, :func:`lazykern.native.extra_flags`): ``LAZYKERN_KEOPS_FLAGS`` if set, else
    :data:`FAST_FLAGS` on x86-64 Linux (where they were measured), else none (KeOps' defaults).

    Example:
        >>> import os
        >>> os.environ["LAZYKERN_KEOPS_FLAGS"] = ""
        >>> compile_flags()
        ''
        >>> del os.environ["LAZYKERN_KEOPS_FLAGS"]
    """
    if FLAGS_ENV in os.environ:
        return " ".join(os.environ[FLAGS_ENV].split())
    if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
        return FAST_FLAGS
    return ""


def build_folder(flags: str | None = None) -> str:
    r"""The KeOps build folder of lazykern's reductions compiled with ``flags`` (default:
    :func:`compile_flags`):
    ``<base>/<KeOps machine folder name>/flags-<hash of flags, CPU model, compiler>``, where
    ``<base>`` is ``LAZYKERN_KEOPS_CACHE`` or ``<KeOps cache folder>/lazykern``. A ``flags.txt``
    in it records what was hashed. Deleting the folder is safe: formulas are recompiled.

    Example:
        >>> os.path.basename(build_folder("-O2")).startswith("flags-"), build_folder("-O2") == build_folder("-O3")
        (True, False)
    """
    from keopscore.config import config

    flags = compile_flags() if flags is None else " ".join(flags.split())
    base = os.environ.get(CACHE_ENV) or os.path.join(config.get_keops_cache_folder(), "lazykern")
    identity = f"flags={flags}\ncompiler={config.get_cxx_compiler()}\ncpu={cpu_model()}\n"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    return os.path.join(os.path.expanduser(base), config.get_default_build_folder_name(), f"flags-{digest}")


@contextlib.contextmanager
def keops_session() -> Iterator[None]:
    """Context for lazykern's KeOps reductions: those created inside it (and the gradient
    reductions KeOps later derives from them) compile with :func:`compile_flags` into
    :func:`build_folder`. Other KeOps code, inside or outside, is unaffected. Re-entrant.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(600, 3, dtype=torch.float64)
        >>> with keops_session():  # the RBF formula of K(x, x), as lazykern's engines write it
        ...     K = StationaryFormula("rbf")(keops_lazy_tensor(x[:, None]), keops_lazy_tensor(x[None]))
        ...     out = K @ torch.ones(600, 2, dtype=torch.float64)
        >>> out.shape
        torch.Size([600, 2])
    """
    _install()
    depth = getattr(_session, "depth", 0)
    _session.depth = depth + 1
    try:
        yield
    finally:
        _session.depth = depth


def _install() -> None:
    """Hook KeOps once per process: tag options of reductions built in a keops_session, and route every
    load through :class:`_LazykernLoader` (tagged CPU loads with lazykern's flags, all others as
    KeOps would, under the same lock). Nothing is hooked on a version outside
    :data:`PATCHED_VERSIONS`."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        if VERSION_PROBLEM is None:
            import pykeops.torch.generic.generic_red as generic_red
            from pykeops.common.keops_io import keops_binder

            original_flags = generic_red.get_optional_flags

            def get_optional_flags(*args: Any, **kwargs: Any) -> dict:
                options = original_flags(*args, **kwargs)
                if getattr(_session, "depth", 0):
                    options[_MARK] = compile_flags()
                return options

            generic_red.get_optional_flags = get_optional_flags
            for key in list(keops_binder):
                keops_binder[key] = _LazykernLoader(keops_binder[key], lazykern_builds=key == "cpp")
            # A GPU loader registered later (lazykern's CUDA discovery builds KeOps' NVRTC engine
            # late) is wrapped the same way.
            discovery.gpu_loader_hook = lambda loader: _LazykernLoader(loader, lazykern_builds=False)
        _installed = True


def loaded_reductions() -> int:
    """How many distinct KeOps reductions this process has loaded so far, each compiled or read
    from a cache folder (lazykern's and any other code's; 0 before KeOps is first used).

    Example:
        >>> loaded_reductions() >= 0
        True
    """
    if "pykeops.common.keops_io" not in sys.modules:  # KeOps never ran: nothing to import for it
        return 0
    from pykeops.common.keops_io import keops_binder

    count = 0
    for loader in keops_binder.values():
        if isinstance(loader, _LazykernLoader):
            count += len(loader._loaded)
            loader = loader._keops_loader
        # KeOps' loaders keep one entry per reduction they loaded (keopscore.utils.Cache).
        count += len(getattr(loader, "library", ()))
    return count


class _LazykernLoader:
    """Stands in for a KeOps loader (``keops_binder["cpp"]`` or ``["nvrtc"]``). On the CPU,
    reductions carrying lazykern's mark are built with lazykern's flags in lazykern's folder, under
    the compile lock, and kept in a per-process table; all others go to KeOps' own loader
    untouched, under the same thread lock (so they never see lazykern's flags switched in)."""

    def __init__(self, keops_loader: Any, lazykern_builds: bool) -> None:
        self._keops_loader = keops_loader
        self._lazykern_builds = lazykern_builds
        self._loaded: dict[str, Any] = {}

    def __call__(self, *args: Any) -> Any:
        if not self._lazykern_builds:  # the GPU loader: KeOps' health check (a subprocess) first
            require(args[4])  # generic_red passes (tagCPUGPU, tag1D2D, tagHostDevice, use_ranges, device_id, ...)
        options = args[-1]
        flags = options.get(_MARK) if (self._lazykern_builds and isinstance(options, dict)) else None
        if flags is None:
            with _switch_lock:
                return self._keops_loader(*args)
        key = "".join(str(a) for a in args)
        loaded = self._loaded.get(key)
        if loaded is None:
            from pykeops.common.keops_io.LoadKeOps_cpp import LoadKeOps_cpp_class

            with _keops_configured(flags):
                try:
                    loaded = LoadKeOps_cpp_class(*args)
                except ImportError as err:
                    # A compile killed while writing its module leaves it truncated; KeOps would
                    # then fail on it forever. Inside the lock no one is writing it: rebuild once.
                    broken = _truncated_module(err)
                    if broken is None:
                        raise
                    os.remove(broken)
                    loaded = LoadKeOps_cpp_class(*args)
            self._loaded[key] = loaded
        return loaded

    def reset(self, new_save_folder: str | None = None) -> Any:
        self._loaded.clear()
        return self._keops_loader.reset(new_save_folder=new_save_folder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._keops_loader, name)


def _truncated_module(err: ImportError) -> str | None:
    """The compiled module an ``ImportError`` says is truncated or not a shared library, if any."""
    match = re.match(r"(.+\.so): (file too short|invalid ELF header)", str(err))
    return match.group(1) if match and os.path.isfile(match.group(1)) else None


@contextlib.contextmanager
def _keops_configured(flags: str) -> Iterator[str]:
    """KeOps' global compile state switched to lazykern's ``flags`` and folder, then restored.

    Four pieces of KeOps state decide where and how a formula is compiled and loaded: the flags in
    the compile command (``config.cpp_flags``), the copy of them hashed into the formula's file
    names (``LinkCompile.cpp_flags``; without it lazykern's and KeOps' builds of one formula would
    share a module name), the build folder and ``sys.path`` (the compiled module is imported by
    name). KeOps' pickled formula table is bypassed (it lives in KeOps' own folder and may point at
    a lazykern folder that was since deleted): formulas are re-derived from the files in ours.
    """
    import keopscore.binders.LinkCompile as link_compile
    import pykeops.common.keops_io.LoadKeOps as load_keops
    from filelock import FileLock, Timeout
    from keopscore.config import config
    from keopscore.get_keops_dll import get_keops_dll_impl

    folder = build_folder(flags)
    with _switch_lock:
        os.makedirs(folder, exist_ok=True)
        _write_flags_note(folder, flags)
        saved = (config.cpp_flags, link_compile.cpp_flags, config._build_folder, load_keops.get_keops_dll)
        config.cpp_flags = link_compile.cpp_flags = f"{saved[0]} {flags}".rstrip()
        config._build_folder = folder
        load_keops.get_keops_dll = get_keops_dll_impl
        sys.path.insert(0, folder)
        try:
            with FileLock(os.path.join(folder, _LOCK_NAME), timeout=_LOCK_TIMEOUT_S):
                yield folder
        except Timeout as err:
            raise RuntimeError(
                f"lazykern waited {_LOCK_TIMEOUT_S} s for another process compiling into {folder}; "
                f"if none is running, delete {os.path.join(folder, _LOCK_NAME)}"
            ) from err
        finally:
            sys.path.remove(folder)
            config.cpp_flags, link_compile.cpp_flags, config._build_folder, load_keops.get_keops_dll = saved


def _write_flags_note(folder: str, flags: str) -> None:
    note = os.path.join(folder, "flags.txt")
    if not os.path.exists(note):
        tmp = f"{note}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"extra g++ flags: {flags or '(none: KeOps defaults)'}\ncpu: {cpu_model()}\n")
        os.replace(tmp, note)
