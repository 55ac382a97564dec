r"""Where KeOps finds CUDA: torch's pip wheels made visible to keopscore, without writing into ``site-packages``.

torch's CUDA wheels ship CUDA as ``nvidia-*`` packages: the headers ``cuda.h``/``nvrtc.h`` in
``site-packages/nvidia/cu13/include`` (CUDA 13) or in ``nvidia/cuda_nvrtc/include`` and
``nvidia/cuda_runtime/include`` (CUDA 12), and only a *versioned* ``libnvrtc.so.13``/``.so.12``.
keopscore looks for an unversioned ``libnvrtc.so`` (``ctypes.util.find_library``) and for both
headers in one ``$CUDA_PATH/include``; on a pip-only install it finds neither and switches to CPU
only. lazykern builds a *shim* folder of symlinks in its cache (:func:`build_shim`: ``include/``
with the wheels' headers, ``lib64/libnvrtc.so`` and ``libcudart.so`` pointing at the versioned
libraries) and points keopscore at it (:func:`configure`: ``CUDA_PATH``, ``LIBRARY_PATH``, the
libraries preloaded), re-running keopscore's CUDA detection when keopscore was imported before
(GPyTorch imports it).

Everything here is read or built on first GPU use; importing the module costs the standard library
only. These hooks use keopscore 2.3's internals and apply only to the versions
:data:`lazykern.keops.versions.PATCHED_VERSIONS` names.

Example:
    >>> find_wheel_cuda([]) is None
    True
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import hashlib
import os
import re
import sys
import threading
from typing import Any, Callable, Sequence

from ..cache_paths import keops_cache
from .nvrtc import needs_no_cache, nvrtc_version
from .versions import VERSION_PROBLEM

__all__ = ["WheelCuda", "build_shim", "configure", "find_wheel_cuda"]

_lock = threading.Lock()
_configured: list[str | None] = []  # one entry once configure() ran: the shim folder or None

#: Wraps KeOps' GPU loader when :func:`configure` registers it late (keopscore imported before CUDA
#: was found); ``lazykern.keops.session`` sets it when it installs its hooks, so the late loader
#: is guarded like the others. ``None``: registered as KeOps made it.
gpu_loader_hook: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class WheelCuda:
    """The CUDA of torch's ``nvidia-*`` pip wheels in one site-packages folder.

    Attributes:
        include: header folders, in search order (``cuda.h`` and ``nvrtc.h`` among them).
        nvrtc: the versioned ``libnvrtc.so.<major>``.
        cudart: the versioned ``libcudart.so.<major>`` (``None`` when the runtime wheel is absent).
        major: the CUDA major version (12 or 13).
        builtins: NVRTC's ``libnvrtc-builtins.so.<major>.<minor>``, which NVRTC 13 opens by name
            at each compile (found from the loader's search path only, not beside ``libnvrtc``).

    Example:
        >>> WheelCuda(("/site/nvidia/cu13/include",), "/site/nvidia/cu13/lib/libnvrtc.so.13", None, 13).major
        13
    """

    include: tuple[str, ...]
    nvrtc: str
    cudart: str | None
    major: int
    builtins: str | None = None




def find_wheel_cuda(site_dirs: Sequence[str]) -> WheelCuda | None:
    """The CUDA of torch's ``nvidia-*`` wheels in the first of ``site_dirs`` that holds a complete one
    (both headers and a versioned ``libnvrtc``), CUDA 13's layout before CUDA 12's; ``None`` if none.

    Example:
        >>> find_wheel_cuda([]) is None
        True
    """
    layouts = (  # (include folders, library folders) under site-packages/nvidia
        (("cu13/include",), ("cu13/lib",)),
        (("cuda_nvrtc/include", "cuda_runtime/include"), ("cuda_nvrtc/lib", "cuda_runtime/lib")),
    )
    for site in site_dirs:
        root = os.path.join(site, "nvidia")
        if not os.path.isdir(root):
            continue
        for includes, libs in layouts:
            include = tuple(os.path.join(root, f) for f in includes if os.path.isdir(os.path.join(root, f)))
            headers = {name for folder in include for name in os.listdir(folder)}
            nvrtc = _versioned(libs, root, "libnvrtc.so.")
            if {"cuda.h", "nvrtc.h"} <= headers and nvrtc is not None:
                cudart = _versioned(libs, root, "libcudart.so.")
                builtins = _versioned(libs, root, "libnvrtc-builtins.so.")
                return WheelCuda(include, nvrtc, cudart, int(nvrtc.rsplit(".so.", 1)[1].split(".")[0]), builtins)
    return None


def _versioned(folders: Sequence[str], root: str, prefix: str) -> str | None:
    """The highest ``<prefix><major>`` library in ``root/<folder>`` (``libnvrtc.so.13``, not its
    ``-builtins`` or ``.alt`` siblings)."""
    found = [p for f in folders for p in glob.glob(os.path.join(root, f, prefix + "*"))
             if re.fullmatch(re.escape(prefix) + r"\d+(\.\d+)*", os.path.basename(p))]
    return max(found, key=lambda p: [int(v) for v in p.rsplit(".so.", 1)[1].split(".")], default=None)


def build_shim(cuda: WheelCuda, folder: str, libcuda: str | None = None) -> str:
    """A CUDA folder keopscore can use, made of symlinks to ``cuda``'s files; returns ``folder``.

    ``folder/include`` links every header and header folder of ``cuda.include`` (the first folder
    wins a name); ``folder/lib64`` links ``libnvrtc.so`` and ``libnvrtc.so.<major>`` to the
    versioned NVRTC, the same for ``libcudart``, NVRTC's builtins library under its own name, and
    ``libcuda.so`` to the driver's ``libcuda`` when given (containers
    often mount only ``libcuda.so.1``, and KeOps links with ``-lcuda``). Links are replaced
    atomically, so processes building the same shim at once never see a missing one.

    Example:
        >>> import tempfile
        >>> tmp = tempfile.mkdtemp()
        >>> os.makedirs(f"{tmp}/inc"); os.makedirs(f"{tmp}/lib")
        >>> for name in ("inc/cuda.h", "inc/nvrtc.h", "lib/libnvrtc.so.13"):
        ...     open(f"{tmp}/{name}", "w").close()
        >>> shim = build_shim(WheelCuda((f"{tmp}/inc",), f"{tmp}/lib/libnvrtc.so.13", None, 13), f"{tmp}/shim")
        >>> sorted(os.listdir(f"{shim}/include")), sorted(os.listdir(f"{shim}/lib64"))
        (['cuda.h', 'nvrtc.h'], ['libnvrtc.so', 'libnvrtc.so.13'])
    """
    links: dict[str, str] = {}
    for include in cuda.include:
        for name in sorted(os.listdir(include)):
            links.setdefault(os.path.join("include", name), os.path.join(include, name))
    for library in (cuda.nvrtc, cuda.cudart):
        if library is not None:
            base = os.path.basename(library)
            links[os.path.join("lib64", base)] = library
            links[os.path.join("lib64", base.split(".so.")[0] + ".so")] = library
    if cuda.builtins is not None:
        links[os.path.join("lib64", os.path.basename(cuda.builtins))] = cuda.builtins
    if libcuda is not None:
        links[os.path.join("lib64", "libcuda.so")] = libcuda
    for sub in ("include", "lib64"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    for name, target in links.items():
        path = os.path.join(folder, name)
        if os.path.islink(path) and os.readlink(path) == target:
            continue
        tmp = f"{path}.{os.getpid()}.tmp"
        os.symlink(target, tmp)
        os.replace(tmp, path)
    return folder


def _site_dirs() -> list[str]:
    return [p for p in dict.fromkeys(sys.path) if p and os.path.isdir(os.path.join(p, "nvidia"))]


def _header_folder() -> str | None:
    """Where keopscore would find ``cuda.h`` and ``nvrtc.h`` without help (its own search order)."""
    candidates = [os.environ.get(v) for v in ("CUDA_PATH", "CUDA_HOME", "CONDA_PREFIX")]
    for base in [*candidates, "/usr/local/cuda", "/opt/cuda"]:
        include = os.path.join(base, "include") if base else ""
        if base and all(os.path.isfile(os.path.join(include, h)) for h in ("cuda.h", "nvrtc.h")):
            return include
    return None


def _loaded_path(fragment: str) -> str | None:
    """The file of a loaded shared library whose path contains ``fragment`` (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if fragment in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


def _driver_libcuda() -> str | None:
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    return _loaded_path("libcuda.so")


def configure() -> str | None:
    """Point keopscore at the CUDA of torch's pip wheels when it would find no usable CUDA itself;
    once per process. Returns the shim folder used (``None``: keopscore's own discovery is kept,
    or there is no wheel CUDA to point it at).

    Sets ``CUDA_PATH`` (where keopscore reads the headers, unless a folder it searches already has
    them), puts the shim's ``lib64`` first on ``LIBRARY_PATH`` and ``LD_LIBRARY_PATH`` (the linker
    and ``find_library`` search them; child processes inherit them) and preloads the versioned
    libraries globally (``find_library`` answers with their ``.so.<major>`` names, which the loader
    then finds already loaded). If keopscore was already imported, its CUDA detection is re-run.

    Example (on a machine whose only CUDA is torch's wheels):
        >>> configure()  # doctest: +SKIP
        '/root/.cache/keops2.3/lazykern/cuda-shim-19e0443286'
    """
    with _lock:
        if not _configured:
            _configured.append(_configure())
        return _configured[0]


def _configure() -> str | None:
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return None
    have_headers = _header_folder() is not None
    if have_headers and ctypes.util.find_library("nvrtc") and ctypes.util.find_library("cudart"):
        return None
    cuda = find_wheel_cuda(_site_dirs())
    if cuda is None:
        return None
    digest = hashlib.sha256(repr(dataclasses.astuple(cuda)).encode()).hexdigest()[:10]
    shim = build_shim(cuda, os.path.join(keops_cache(), f"cuda-shim-{digest}"), _driver_libcuda())
    lib = os.path.join(shim, "lib64")
    if not have_headers:
        os.environ["CUDA_PATH"] = shim
    for var in ("LIBRARY_PATH", "LD_LIBRARY_PATH"):
        os.environ[var] = os.pathsep.join([lib, *[p for p in os.environ.get(var, "").split(os.pathsep) if p]])
    for library in (cuda.builtins, cuda.nvrtc, cuda.cudart):
        if library is not None:
            ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    if "keopscore.config" in sys.modules and VERSION_PROBLEM is None:
        _redetect()
    return shim


def _redetect() -> None:
    """Re-run keopscore's CUDA detection in place, for a keopscore imported before :func:`configure`
    that found no CUDA, and enable what its import and pykeops' skip without it (the GPU map-reduce
    classes, pykeops' ``gpu_available``, its NVRTC binder and loader)."""
    import importlib

    from keopscore.config import cuda_config

    if cuda_config.get_use_cuda():
        return
    cuda_config.__init__()
    if not cuda_config.get_use_cuda():
        return
    import keopscore

    keopscore.show_cuda_status = True
    keopscore.cuda_block_size = cuda_config.get_cuda_block_size()
    stale = sys.modules.get("keopscore.binders.nvrtc.Gpu_link_compile")
    if stale is not None:  # imported without CUDA: its module-level settings say so
        importlib.reload(stale)
    glc = importlib.import_module("keopscore.binders.nvrtc.Gpu_link_compile")
    if not needs_no_cache(nvrtc_version()) and not os.path.exists(glc.jit_compile_dll()):
        glc.Gpu_link_compile.compile_jit_compile_dll()  # what keopscore's import builds (NVRTC >= 13: ours instead)
    import keopscore.mapreduce as mapreduce
    import keopscore.mapreduce.gpu as gpu_reductions

    vars(mapreduce).update({k: v for k, v in vars(gpu_reductions).items() if not k.startswith("_")})
    if "pykeops.config" not in sys.modules:
        return
    import pykeops.config
    from pykeops.common import keops_io
    from pykeops.common.keops_io import LoadKeOps_nvrtc

    pykeops.config.gpu_available = True
    if not os.path.exists(pykeops.config.pykeops_nvrtc_name(type="target")):
        LoadKeOps_nvrtc.compile_jit_binary()
    if "nvrtc" not in keops_io.keops_binder:
        loader: Any = LoadKeOps_nvrtc.LoadKeOps_nvrtc
        keops_io.keops_binder["nvrtc"] = loader if gpu_loader_hook is None else gpu_loader_hook(loader)


