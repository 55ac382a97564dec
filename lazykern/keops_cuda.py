r"""KeOps on the CUDA stacks users have: pip-only CUDA, NVRTC 13, and a health check that never kills.

keopscore 2.3 compiles GPU reductions with NVRTC, through an engine library it builds itself
(``keopscore/binders/nvrtc/nvrtc_jit.cpp``). Three things stand between it and the GPUs users have;
this module answers each without writing into ``site-packages``:

* **Discovery** (:func:`configure`). torch's CUDA wheels ship CUDA as ``nvidia-*`` packages: the
  headers ``cuda.h``/``nvrtc.h`` in ``site-packages/nvidia/cu13/include`` (CUDA 13) or in
  ``nvidia/cuda_nvrtc/include`` and ``nvidia/cuda_runtime/include`` (CUDA 12), and only a
  *versioned* ``libnvrtc.so.13``/``.so.12``. keopscore looks for an unversioned ``libnvrtc.so``
  (``ctypes.util.find_library``) and for both headers in one ``$CUDA_PATH/include``; on a pip-only
  install it finds neither and switches to CPU only. lazykern builds a *shim* folder of symlinks in
  its cache (:func:`build_shim`: ``include/`` with the wheels' headers, ``lib64/libnvrtc.so`` and
  ``libcudart.so`` pointing at the versioned libraries) and points keopscore at it (``CUDA_PATH``,
  ``LIBRARY_PATH``, the libraries preloaded), re-running keopscore's CUDA detection when keopscore
  was imported before (GPyTorch imports it).
* **NVRTC >= 13** (:func:`select_jit_engine`). NVRTC 13 has a compile cache backed by the driver:
  inside ``nvrtcCompileProgram`` it calls ``cuGetExportTable`` and dereferences NULL when the driver
  hands back no table (seen on an H200, driver 580: the Python process dies on the first formula).
  NVRTC 13's option ``--no-cache`` skips that cache; NVRTC 12 rejects the option. On NVRTC >= 13,
  lazykern compiles a copy of ``nvrtc_jit.cpp`` with ``--no-cache`` in every option list
  (:func:`patched_jit_source`) into its cache and makes keopscore load it, through
  ``keopscore.binders.nvrtc.Gpu_link_compile.jit_compile_dll``.
* **Health** (:func:`health`). Before the first KeOps GPU compile of a process, one tiny compile and
  reduction runs in a *subprocess*; a crash there (a signal), a hang or a wrong value becomes a
  :class:`Health` whose ``cause`` names it, and lazykern's engine choice
  (:func:`lazykern.backend.engine_for`) uses another engine with one warning. The verdict is kept
  on disk per driver, NVRTC, keopscore and GPU model (:func:`verdict_path`), so the probe runs once
  per stack, not once per process.

Everything here is read or built on first GPU use; importing the module costs the standard library
only. These hooks use keopscore 2.3's internals, like :mod:`lazykern.keops`, and apply only to the
versions it pins (:data:`lazykern.keops.PATCHED_VERSIONS`).

Example:
    >>> from lazykern import keops_cuda
    >>> keops_cuda.needs_no_cache((13, 0)), keops_cuda.needs_no_cache((12, 8))
    (True, False)
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from importlib import metadata
from typing import Any, Mapping, Sequence

from .cache_paths import keops_cache

__all__ = [
    "Health",
    "NO_CACHE_OPTIONS",
    "WheelCuda",
    "build_shim",
    "configure",
    "find_wheel_cuda",
    "health",
    "needs_no_cache",
    "nvrtc_version",
    "patched_jit_source",
    "require",
    "select_jit_engine",
    "verdict_path",
]

#: The NVRTC options added to every compile of KeOps' engine on NVRTC >= 13 (see the module docstring).
NO_CACHE_OPTIONS = ("--no-cache",)

# The probe's whole budget: a fresh cache builds KeOps' NVRTC engine and its pybind11 binder (g++,
# up to a minute each on a slow machine) before the one NVRTC compile it is there for.
_PROBE_TIMEOUT_S = 300
# Bumped when what the probe checks changes: older verdicts on disk are then ignored.
_PROBE_REVISION = 1
_PROBE_OK = "LAZYKERN_KEOPS_PROBE_OK"
_PROBE_ENV = "LAZYKERN_KEOPS_PROBE"  # set in the probe's process

_lock = threading.RLock()
_configured: list[str | None] = []  # one entry once configure() ran: the shim folder or None
_engine_selected: list[str | None] = []
_verdicts: dict[int, "Health"] = {}


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


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"


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
    from .keops import VERSION_PROBLEM

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
        from . import keops

        loader: Any = LoadKeOps_nvrtc.LoadKeOps_nvrtc
        keops_io.keops_binder["nvrtc"] = keops.hooked_gpu_loader(loader)


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
    from .keops import VERSION_PROBLEM

    if VERSION_PROBLEM is not None or not needs_no_cache(nvrtc_version()):
        return None
    import importlib

    from filelock import FileLock
    from keopscore.config import config

    glc = importlib.import_module("keopscore.binders.nvrtc.Gpu_link_compile")
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
    """What KeOps' GPU verdict depends on, for GPU ``index`` (after :func:`configure`)."""
    import torch

    version = nvrtc_version()
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
    return [sys.executable, "-m", "lazykern.keops_cuda", str(index)]


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
    verdict is then written. Runs :func:`configure` and :func:`select_jit_engine` first, as the probe
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
    from .keops import VERSION_PROBLEM

    try:
        configure()
    except Exception as err:  # noqa: BLE001 - e.g. KeOps' engine build failing in keopscore's re-run detection
        return Health(False, f"keopscore could not be set up for the pip CUDA ({type(err).__name__}: {err})"[:500], {})
    from keopscore.config import cuda_config

    stack = _stack(index)
    if not cuda_config.get_use_cuda():
        reason = cuda_config.cuda_message or "no usable CUDA found"
        return Health(False, f"keopscore runs CPU only ({reason.rstrip('.')}; set CUDA_PATH to a CUDA toolkit)", stack)
    if VERSION_PROBLEM is None:
        try:
            select_jit_engine()
        except Exception as err:  # noqa: BLE001 - a failed build is a verdict, not a crash of the caller
            return Health(False, f"KeOps' NVRTC engine could not be built with {' '.join(NO_CACHE_OPTIONS)} ({err})", stack)
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
    """The probe, run as ``python -m lazykern.keops_cuda INDEX``: lazykern's CUDA configuration,
    then one KeOps reduction compiled fresh (an integer in the formula no earlier probe used) on GPU
    ``index``, checked against torch; prints ``LAZYKERN_KEOPS_PROBE_OK`` on success."""
    import secrets

    configure()
    import torch

    select_jit_engine()
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
