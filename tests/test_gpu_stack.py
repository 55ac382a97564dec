"""KeOps on the CUDA stacks users have, tested without a GPU.

* discovery: fake ``site-packages`` trees with the layouts of torch's CUDA 13 and CUDA 12 wheels
  (headers, versioned libraries built here as tiny stand-ins that answer ``nvrtcVersion``) give the
  shim's layout, and keopscore's own library lookup finds NVRTC through it;
* NVRTC 13: the rewrite of the installed keopscore's ``nvrtc_jit.cpp`` and the version gate;
* the health check: a probe that crashes on purpose (SIGSEGV), fails or hangs leaves this process
  alive with one warning naming the cause and the engine used; verdicts are cached per stack;
* no import cost for ``lazykern --help``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
import warnings

import pytest
import torch

from lazykern import backend, settings
from lazykern.formulas import StationaryFormula
from lazykern.keops import CACHE_ENV, discovery, health, nvrtc

RBF = StationaryFormula("rbf", additive=True)
STACK = {"driver": "580.65.06", "nvrtc": "13.0", "keopscore": "2.3", "gpu": "NVIDIA Test GPU"}
CRASH = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"


def _stub_library(path, soname, function, major, minor):
    """A shared library named ``soname`` exporting ``function(int *)`` or ``function(int *, int *)``."""
    compiler = shutil.which("gcc") or shutil.which("g++")
    assert compiler, "a C compiler is needed (lazykern's CPU engine needs one too)"
    src = f"{path}.c"
    with open(src, "w") as f:
        if function == "nvrtcVersion":
            f.write(f"int nvrtcVersion(int *a, int *b) {{ *a = {major}; *b = {minor}; return 0; }}\n")
        else:
            f.write(f"int {function}(int *v) {{ *v = {major * 1000 + minor * 10}; return 0; }}\n")
    subprocess.run([compiler, "-x", "c", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), src], check=True)
    os.remove(src)


def _wheel_site(root, major, minor=0):
    """A site-packages folder laid out as torch's ``nvidia-*`` wheels of CUDA ``major`` lay it out."""
    nvidia = root / "site-packages" / "nvidia"
    if major >= 13:
        include = lib_nvrtc = lib_rt = nvidia / "cu13"
        headers = {"cuda.h": include, "nvrtc.h": include, "cuda_fp16.h": include}
    else:
        include, lib_nvrtc, lib_rt = nvidia / "cuda_nvrtc", nvidia / "cuda_nvrtc", nvidia / "cuda_runtime"
        headers = {"nvrtc.h": nvidia / "cuda_nvrtc", "cuda.h": nvidia / "cuda_runtime", "cuda_fp16.h": nvidia / "cuda_runtime"}
    for name, folder in headers.items():
        (folder / "include").mkdir(parents=True, exist_ok=True)
        (folder / "include" / name).write_text(f"/* {name} */\n")
    for folder in (lib_nvrtc, lib_rt):
        (folder / "lib").mkdir(parents=True, exist_ok=True)
    _stub_library(lib_nvrtc / "lib" / f"libnvrtc.so.{major}", f"libnvrtc.so.{major}", "nvrtcVersion", major, minor)
    _stub_library(lib_rt / "lib" / f"libcudart.so.{major}", f"libcudart.so.{major}", "cudaRuntimeGetVersion", major, minor)
    builtins = f"libnvrtc-builtins.so.{major}.{minor}"
    _stub_library(lib_nvrtc / "lib" / builtins, builtins, "nvrtcBuiltinsVersion", major, minor)
    # Siblings that are not NVRTC itself: never picked.
    (lib_nvrtc / "lib" / f"libnvrtc.alt.so.{major}").write_text("")
    (lib_nvrtc / "lib" / f"libnvrtc-builtins.alt.so.{major}.{minor}").write_text("")
    return str(root / "site-packages")


@pytest.mark.parametrize("major", [13, 12])
def test_shim_from_the_wheel_layout(tmp_path, major):
    site = _wheel_site(tmp_path, major)
    cuda = discovery.find_wheel_cuda([str(tmp_path / "elsewhere"), site])
    assert cuda is not None and cuda.major == major
    assert os.path.basename(cuda.nvrtc) == f"libnvrtc.so.{major}"
    assert os.path.basename(cuda.cudart) == f"libcudart.so.{major}"
    assert os.path.basename(cuda.builtins) == f"libnvrtc-builtins.so.{major}.0"
    shim = discovery.build_shim(cuda, str(tmp_path / "shim"), libcuda="/usr/lib/libcuda.so.1")
    assert sorted(os.listdir(f"{shim}/include")) == ["cuda.h", "cuda_fp16.h", "nvrtc.h"]
    for name in ("cuda.h", "nvrtc.h"):  # keopscore's test: both headers are files of one include folder
        assert os.path.isfile(f"{shim}/include/{name}")
    links = {n: os.readlink(f"{shim}/lib64/{n}") for n in os.listdir(f"{shim}/lib64")}
    assert links == {
        "libnvrtc.so": cuda.nvrtc, f"libnvrtc.so.{major}": cuda.nvrtc,
        "libcudart.so": cuda.cudart, f"libcudart.so.{major}": cuda.cudart,
        f"libnvrtc-builtins.so.{major}.0": cuda.builtins,  # NVRTC 13 opens it by name at each compile
        "libcuda.so": "/usr/lib/libcuda.so.1",
    }
    assert discovery.build_shim(cuda, shim, libcuda="/usr/lib/libcuda.so.1") == shim  # again: unchanged
    assert nvrtc.nvrtc_version(f"{shim}/lib64") == (major, 0)


def test_incomplete_wheels_are_not_a_cuda(tmp_path):
    site = _wheel_site(tmp_path, 13)
    os.remove(f"{site}/nvidia/cu13/include/nvrtc.h")
    assert discovery.find_wheel_cuda([site]) is None
    assert discovery.find_wheel_cuda([str(tmp_path / "no-such-site")]) is None


def test_keopscore_finds_nvrtc_through_the_shim(tmp_path):
    """In a fresh process, as a user's: configure() before keopscore's import, then keopscore's own
    lookup (find_library, then loading what it names) finds the wheel's versioned NVRTC. torch is
    imported first, as lazykern imports it: a CUDA build of torch has loaded its own wheel's
    libnvrtc.so.13 by then (which keopscore, loading by that name, then shares), a CPU build none (the
    stand-in wheel's is found)."""
    site = _wheel_site(tmp_path, 13)
    code = f"""
import ctypes.util, json, os, sys
import torch
torch_nvrtc = next((line.split()[-1] for line in open("/proc/self/maps") if "libnvrtc.so" in line), None)
sys.path.insert(0, {site!r})
from lazykern.keops import discovery, nvrtc
shim = discovery.configure()
from keopscore.config import cuda_config
found, path, error = cuda_config._try_load_library("nvrtc")
print(json.dumps({{"torch_nvrtc": torch_nvrtc, "shim": shim, "cuda_path": os.environ.get("CUDA_PATH"),
                  "library_path": os.environ["LIBRARY_PATH"],
                  "find_library": ctypes.util.find_library("nvrtc"), "found": found, "path": path, "error": error,
                  "version": nvrtc.nvrtc_version(os.path.dirname(path)) if found else None}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_PATH", "CUDA_HOME", "CONDA_PREFIX", "LIBRARY_PATH")}
    env.update({CACHE_ENV: str(tmp_path / "cache"), "KEOPS_CACHE_FOLDER": str(tmp_path / "keops"), "KEOPS_VERBOSE": "0"})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    shim = out["shim"]
    assert shim.startswith(str(tmp_path / "cache")) and os.path.isdir(f"{shim}/include")
    assert out["cuda_path"] == shim and out["library_path"].split(os.pathsep)[0] == f"{shim}/lib64"
    assert out["find_library"] == "libnvrtc.so.13"
    assert out["found"], out["error"]
    wheel_nvrtc = out["torch_nvrtc"] or f"{site}/nvidia/cu13/lib/libnvrtc.so.13"
    assert os.path.realpath(out["path"]) == os.path.realpath(wheel_nvrtc)
    assert out["version"] == [13, 0]


def _compile_calls(source):
    """(declared options, count passed) of each nvrtcCompileProgram call of nvrtc_jit.cpp."""
    calls = re.findall(r"const char \*(\w+)\[\] = \{([^}]*)\};\s*compileResult = nvrtcCompileProgram\(prog,\s*(?://[^\n]*)?\s*(\d+),", source)
    return [([o.strip() for o in opts.split(",")], int(count)) for _, opts, count in calls]


def test_nvrtc_source_rewrite_of_the_installed_keopscore():
    import keopscore

    with open(os.path.join(os.path.dirname(keopscore.__file__), "binders", "nvrtc", "nvrtc_jit.cpp")) as f:
        source = f.read()
    patched = nvrtc.patched_jit_source(source)
    before, after = _compile_calls(source), _compile_calls(patched)
    assert len(after) == len(before) == source.count("nvrtcCompileProgram(") >= 2
    for (old, old_count), (new, new_count) in zip(before, after):
        assert new == old + ['"--no-cache"'] and new_count == old_count + 1 == len(new)
    assert patched.replace(', "--no-cache"', "") != source  # counts changed too ...
    assert len(patched) - len(source) == len(before) * len(', "--no-cache"')  # ... and nothing else
    with pytest.raises(RuntimeError, match="not patched"):
        nvrtc.patched_jit_source(source.replace("const char *opts[] = {arch_flag_char};", "auto opts = {arch_flag_char};"))


@pytest.fixture
def fake_jit_module(monkeypatch, tmp_path):
    """keopscore's Gpu_link_compile as seen on a GPU machine (it cannot be imported without CUDA),
    with the engine build replaced by a stand-in that records the command and writes the library."""
    import keopscore

    builds = []

    def run(command, output):
        builds.append(command)
        with open(output, "w") as f:
            f.write("library")

    module = types.SimpleNamespace(
        jit_compile_src=os.path.join(os.path.dirname(keopscore.__file__), "binders", "nvrtc", "nvrtc_jit.cpp"),
        jit_compile_dll=lambda: str(tmp_path / "keops-build" / "nvrtc_jit.so"),
        Gpu_link_compile=types.SimpleNamespace(
            get_compile_command=lambda sourcename, dllname: f"g++ -shared -DMAXIDGPU=0 {sourcename} -o {dllname}"),
    )
    monkeypatch.setitem(sys.modules, "keopscore.binders.nvrtc.Gpu_link_compile", module)
    monkeypatch.setattr(nvrtc, "_compile", run)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    module.builds = builds
    return module


@pytest.mark.parametrize("version, patched", [((13, 0), True), ((12, 8), False), (None, False)])
def test_version_gate_selects_the_no_cache_engine_on_nvrtc_13_only(fake_jit_module, monkeypatch, version, patched):
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda folder=None: version)
    keops_default = fake_jit_module.jit_compile_dll
    library = nvrtc._select_jit_engine()
    if not patched:
        assert library is None and fake_jit_module.builds == [] and fake_jit_module.jit_compile_dll is keops_default
        return
    assert library.startswith(os.environ[CACHE_ENV]) and fake_jit_module.jit_compile_dll() == library
    (command,) = fake_jit_module.builds
    src = command.split()[-3]
    with open(fake_jit_module.jit_compile_src) as f, open(src) as g:
        assert g.read() == nvrtc.patched_jit_source(f.read())
    assert nvrtc._select_jit_engine() == library and len(fake_jit_module.builds) == 1  # built once


def test_a_failed_engine_build_names_the_compiler_error(tmp_path):
    source = tmp_path / "engine.cpp"
    source.write_text("#include <nv/target>\n")
    with pytest.raises(RuntimeError, match=r"g\+\+ failed: .*nv/target.*nvidia-cuda-crt nvidia-cuda-cccl"):
        nvrtc._compile(f"g++ -shared -fPIC {source} -o {tmp_path / 'engine.so'}", str(tmp_path / "engine.so"))


@pytest.fixture
def gpu_stack(monkeypatch, tmp_path):
    """A CUDA device as lazykern's engine choice sees one, with the probe command up to the test."""
    from keopscore.config import cuda_config

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(cuda_config, "_use_cuda", True)
    monkeypatch.setattr(discovery, "configure", lambda: None)
    monkeypatch.setattr(nvrtc, "select_jit_engine", lambda: None)
    monkeypatch.setattr(health, "_stack", lambda index: dict(STACK))
    monkeypatch.setattr(health, "_verdicts", {})
    monkeypatch.setattr(backend, "_warned", set())
    monkeypatch.setattr(backend, "_triton_runs", lambda *args: True)
    runs = []

    def probe(code):
        def command(index):
            runs.append(index)
            return [sys.executable, "-c", code]
        monkeypatch.setattr(health, "_probe_command", command)

    device = torch.device("cuda", 0)
    x = types.SimpleNamespace(shape=torch.Size([600, 3]), device=device)  # what engine_for reads of a tensor
    return types.SimpleNamespace(probe=probe, runs=runs, device=device, x=x)


def test_crashing_probe_leaves_the_caller_alive_on_another_engine(gpu_stack):
    gpu_stack.probe(CRASH)
    with pytest.warns(RuntimeWarning) as caught:
        assert backend.engine_for(RBF, gpu_stack.x, gpu_stack.x, {}) == "triton"
        assert backend.engine_for(RBF, gpu_stack.x, gpu_stack.x, {}) == "triton"  # once: no second probe, warning
    messages = [str(w.message) for w in caught if "health check" in str(w.message)]
    assert messages == [
        "KeOps' GPU compile crashed (SIGSEGV, signal 11) in a health check; using the triton engine instead"]
    assert gpu_stack.runs == [0]
    with settings.engine("keops"), pytest.raises(RuntimeError, match=r"crashed \(SIGSEGV, signal 11\).*cannot run"):
        backend.engine_for(RBF, gpu_stack.x, gpu_stack.x, {})
    assert "KeOps cannot run: KeOps' GPU compile crashed" in backend.engine_report(gpu_stack.device) or \
        not torch.cuda.is_available()


def test_verdict_cache_per_stack(gpu_stack, monkeypatch):
    gpu_stack.probe(CRASH)
    first = health.health(gpu_stack.device)
    assert not first.ok and not first.cached and gpu_stack.runs == [0]
    with open(health.verdict_path(STACK)) as f:
        assert json.load(f)["stack"] == STACK
    monkeypatch.setattr(health, "_verdicts", {})  # a new process: the verdict file answers
    again = health.health(gpu_stack.device)
    assert again.cached and (again.ok, again.cause) == (first.ok, first.cause) and gpu_stack.runs == [0]
    # Another driver (or NVRTC, keopscore, GPU model): another verdict, probed afresh.
    other = {**STACK, "driver": "590.10"}
    assert health.verdict_path(other) != health.verdict_path(STACK)
    monkeypatch.setattr(health, "_stack", lambda index: dict(other))
    monkeypatch.setattr(health, "_verdicts", {})
    gpu_stack.probe(f"print({health._PROBE_OK!r})")
    healthy = health.health(gpu_stack.device)
    assert healthy.ok and not healthy.cached and gpu_stack.runs == [0, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a healthy KeOps: chosen, nothing said
        assert backend.engine_for(RBF, gpu_stack.x, gpu_stack.x, {}) == "keops"


def test_failing_and_hanging_probes_name_their_cause(gpu_stack, monkeypatch):
    gpu_stack.probe("import sys; sys.exit('KeOps error: nvrtcCompileProgram failed')")
    assert health._run_probe(0) == (False, "KeOps' GPU health check failed: KeOps error: nvrtcCompileProgram failed")
    monkeypatch.setattr(health, "_PROBE_TIMEOUT_S", 1)
    gpu_stack.probe("import time; time.sleep(30)")
    assert health._run_probe(0) == (False, "KeOps' GPU health check did not finish in 1 s")
    monkeypatch.setattr(backend, "_triton_runs", lambda *args: False)
    monkeypatch.setattr(health, "_verdicts", {})
    with pytest.warns(RuntimeWarning, match="did not finish in 1 s; using the torch engine instead"):
        assert backend.engine_for(RBF, gpu_stack.x, gpu_stack.x, {}) == "torch"


def test_cpu_choice_and_report_unchanged():
    x = torch.randn(600, 3, dtype=torch.float64)
    assert backend.engine_for(StationaryFormula("rbf"), x, x, {}) == "cpu"
    assert backend.engine_report("cpu").startswith("cpu: engine 'auto': the structured engine for first-order additive")
    assert "lazykern's CPU engine for the formulas it compiles" in backend.engine_report("cpu")
    with settings.engine("torch"):
        assert backend.engine_report("cpu") == "cpu: engine 'torch' (forced by lazykern.settings.engine)"


def test_help_imports_none_of_it():
    code = ("import sys, contextlib, io\nfrom lazykern.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--help'])\nprint(sorted(m for m in sys.modules if m in ('lazykern.keops.session', 'lazykern.keops.health', 'lazykern.keops.engine', 'lazykern.backend') or m.startswith(('torch', 'keopscore'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_gpu_benchmark_driver_runs_tiny_on_cpu(tmp_path):
    """benchmarks/gpu.py, the driver of benchmarks/gpu.sh, at toy sizes on the CPU (its plumbing,
    not the GPU's numbers): every cell ends with a status and the peak memory, files are written."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_benchmark", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu.py"))
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    assert gpu.main(["--tiny", "--parts", "probe", "krr_cg", "--out", str(tmp_path), "--name", "tiny"]) == 0
    saved = json.loads((tmp_path / "tiny.json").read_text())
    cells = saved["results"]
    assert [c["part"] for c in cells] == ["probe", "krr_cg", "krr_cg"]
    assert all(c["status"] == "ok" and c["peak_memory_bytes"] > 0 for c in cells), cells
    assert cells[0]["report"].startswith("cpu: engine 'auto'")
    assert "| krr_cg | lazykern-cpu | 256 |" in (tmp_path / "tiny.md").read_text()
    assert subprocess.run(["bash", "-n", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu.sh")]).returncode == 0


def test_symbolic_reductions_of_the_ntk_take_the_gpu_engine_choice(gpu_stack):
    """The NTK's ``"keops"`` backend (and its throughput probe) runs where engine_for would send a
    symbolic reduction: on a GPU whose KeOps crashes its health check, the Triton engine."""
    from lazykern.ntk import products

    assert backend.preferred("keops", "cpu").engine.name == "keops"  # CPUs: unchanged
    gpu_stack.probe(CRASH)
    with pytest.warns(RuntimeWarning, match="health check; using the triton engine instead"):
        assert backend.preferred("keops", gpu_stack.device).engine.name == "triton"
    assert backend.preferred(products.BACKEND_ENGINES["keops"], gpu_stack.device).engine.name == "triton"
    assert backend.preferred(products.BACKEND_ENGINES["dense"], gpu_stack.device).engine.name == "torch"
