"""Empirical NTK of real architectures: lazykern against torch.func, nngeometry and neural-tangents.

Each measurement runs in its own subprocess under an ``RLIMIT_AS`` cap (a peer that exceeds it
is recorded as "out of memory") with ``OMP_WAIT_POLICY=PASSIVE``, and reports the median wall time
of its repeats (at least three, more until they add up to 3 s, at most 25; after one untimed
warm-up call, also the first call's time) and its peak-RSS increase (VmHWM) over the process after
imports, setup and the warm-up. All methods of a row run in the same invocation, one after the
other, and those under 10 s a call then run a second round in reverse order (a fresh subprocess;
the median is over both rounds' calls, the peak the larger). float32 throughout; the quantity is
the whole kernel block: full mode ``(N k, N k)`` (or nngeometry's ``(k, N, k, N)``), trace mode
``(N, N)``.

Networks (the NTK benchmark set, plus the MLP of the first NTK benchmark):

* ``conv_gap``: Conv(1->64, 3x3) -> ReLU -> global average pool -> Linear(10), 28x28 inputs;
* ``cifar_cnn``: Conv(3->16, 5x5, pad 2) -> ReLU -> Conv(16->32, 3x3, stride 2, pad 1) -> ReLU ->
  global average pool -> Linear(10), 16x16 inputs;
* ``transformer``: Embedding(1000, 64) -> 2 Transformer encoder layers (4 heads, feed-forward 128,
  no dropout) -> mean over 32 tokens -> Linear(10), integer token inputs;
* ``mlp``: 784-512-512-10 (ReLU).

Peers are optional and never lazykern dependencies:

* torch.func: ``vmap(jacrev)`` per-sample Jacobians of all parameters, then one contraction;
* nngeometry 0.4 (``TorchHooksJacobianBackend.get_gram_matrix``): ``NNGEOMETRY_PYTHON`` (default:
  this Python; install with ``pip install --no-deps nngeometry==0.4 einops unfoldNd``);
* neural-tangents 0.6.5 (stax, structured derivatives, ``implementation=3``, jit compilation timed
  separately): ``NT_PYTHON`` (default ``/work/venvs/nt/bin/python``, built from
  ``/work/shared/bench-envs/neural-tangents.txt``); the convolutional nets and the MLP.

``--scale`` runs the large-N series instead (``benchmarks/results/ntk_scale.*``): the CIFAR-style CNN's
trace-mode kernel written to an ``.npy`` file by ``empirical_ntk(..., out=path)`` in tiles of 2,048
samples at N = 1,024, 4,096, 16,384 and 30,000 (time, peak RSS increase, peak anonymous memory — what
the job holds beyond the file's pages — and bytes written), torch.func's contraction at the same
sizes under the same cap, conjugate gradients on the lazy trace NTK at N = 30,000 (kernel
regression without the dense kernel), and the MLP's full-mode kernel (10 outputs) at ``--mlp-n``
samples to disk. Files go to ``--scratch`` (default: a temporary folder) and are deleted after each
cell.

``--conv-rule`` also times both forms of single convolutions (the layer alone is trainable) to
check the cost rule that picks one (``lazykern.ntk.plan.choose_form``) against the measured times.

Run: ``python benchmarks/ntk.py`` (full sizes; about half an hour on 2 cores) or ``--quick``
(small sizes, one repeat: checks that everything runs); writes ``benchmarks/results/ntk.json`` and
``benchmarks/results/ntk.md``, and the tables ``ntk.rst`` and ``ntk_conv_rule.rst`` that
``docs/ntk.rst`` includes (``--quick`` writes only ``ntk_quick.json`` and ``ntk_quick.md``).
``--note TEXT`` records what else ran on the machine meanwhile (printed above the tables);
``--render`` rewrites the tables from ``ntk.json``. Without ``--conv-rule`` the last sweep's rows
are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
AS_CAP = 12 * 2**30
NNGEOMETRY_PYTHON = os.environ.get("NNGEOMETRY_PYTHON", sys.executable)
NT_PYTHON = os.environ.get("NT_PYTHON", "/work/venvs/nt/bin/python")

COMMON = textwrap.dedent(
    """
    import json, statistics, sys, time
    N, MODE, REPEATS = {n}, "{mode}", {repeats}
    MIN_SECONDS, MAX_REPEATS = {min_seconds}, 25

    def peak():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

    def measure(fn, warmup=True):
        first = None
        if warmup:
            t = time.perf_counter(); fn(); first = time.perf_counter() - t
            if first > 60:  # one-time costs are noise at this scale; repeats would take hours
                return {{"median_s": first, "times_s": [first], "first_s": first}}
        times = []
        # a fixed 3 repeats left a sub-second cell's median to one slow call: reach both the count and the time
        while len(times) < REPEATS or (sum(times) < MIN_SECONDS and len(times) < MAX_REPEATS):
            t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
        return {{"median_s": statistics.median(times), "times_s": times, "first_s": first}}
    """
)

NETS = {
    "conv_gap": {
        "title": "Conv(1→64, 3×3) → ReLU → GAP → Linear(10), 28×28",
        "torch": """
            net = nn.Sequential(nn.Conv2d(1, 64, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
            x = torch.randn(N, 1, 28, 28)
        """,
        "stax": """
            layers = [stax.Conv(64, (3, 3), padding="VALID", parameterization="standard"), stax.Relu(),
                      stax.GlobalAvgPool(), stax.Dense(10, parameterization="standard")]
            shape = (N, 28, 28, 1)
        """,
    },
    "cifar_cnn": {
        "title": "Conv(3→16, 5×5) → ReLU → Conv(16→32, 3×3, stride 2) → ReLU → GAP → Linear(10), 16×16",
        "torch": """
            net = nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                                nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
            x = torch.randn(N, 3, 16, 16)
        """,
        "stax": """
            layers = [stax.Conv(16, (5, 5), padding="SAME", parameterization="standard"), stax.Relu(),
                      stax.Conv(32, (3, 3), strides=(2, 2), padding="SAME", parameterization="standard"), stax.Relu(),
                      stax.GlobalAvgPool(), stax.Dense(10, parameterization="standard")]
            shape = (N, 16, 16, 3)
        """,
    },
    "transformer": {
        "title": "Embedding(1000, 64) → 2 × TransformerEncoderLayer(64, 4 heads, ff 128) → mean → Linear(10), 32 tokens",
        "torch": """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embed = nn.Embedding(1000, 64)
                    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
                    self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                    self.head = nn.Linear(64, 10)
                def forward(self, ids):
                    return self.head(self.encoder(self.embed(ids)).mean(1))
            net = Net().eval()
            x = torch.randint(0, 1000, (N, 32))
        """,
        "stax": None,
    },
    "mlp": {
        "title": "MLP 784-512-512-10 (ReLU)",
        "torch": """
            net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
            x = torch.randn(N, 784)
        """,
        "stax": """
            layers = [stax.Dense(512, parameterization="standard"), stax.Relu(), stax.Dense(512, parameterization="standard"),
                      stax.Relu(), stax.Dense(10, parameterization="standard")]
            shape = (N, 784)
        """,
    },
}

TORCH_SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
"""

WORKERS = {
    "lazykern": """
        from lazykern.ntk import empirical_ntk
        empirical_ntk(net, x[:4], mode=MODE).to_dense()  # imports, rate probes
        base = peak()
        r = measure(lambda: empirical_ntk(net, x, mode=MODE).to_dense())
        r["plan"] = str(empirical_ntk(net, x, mode=MODE, plan=True))
    """,
    "torch_func": """
        from torch.func import functional_call, jacrev, vmap
        params = {k: p.detach() for k, p in net.named_parameters()}
        def f(p, xi):
            return functional_call(net, p, (xi[None],))[0]
        def ntk():
            jac = vmap(jacrev(f), (None, 0))(params, x)
            j = torch.cat([a.flatten(2) for a in jac.values()], dim=2)  # (N, k, P)
            if MODE == "trace":
                return torch.einsum("iop,jop->ij", j, j)
            return torch.einsum("iop,jqp->iojq", j, j).reshape(N * j.shape[1], -1)
        base = peak()
        r = measure(ntk)
    """,
    "nngeometry": """
        from nngeometry.backend import TorchHooksJacobianBackend
        def gram():
            g = TorchHooksJacobianBackend(net).get_gram_matrix((x,))  # (k, N, k, N)
            return torch.einsum("oioj->ij", g) if MODE == "trace" else g
        base = peak()
        r = measure(gram)
    """,
    "neural_tangents": """
        import jax, jax.numpy as jnp
        import neural_tangents as nt
        from neural_tangents import stax
        {stax}
        init_fn, apply_fn, _ = stax.serial(*layers)
        _, params = init_fn(jax.random.PRNGKey(0), shape)
        x = jax.random.normal(jax.random.PRNGKey(1), shape)
        trace_axes = (-1,) if MODE == "trace" else ()
        fn = jax.jit(nt.empirical_ntk_fn(apply_fn, trace_axes=trace_axes, implementation=3))
        base = peak()
        t = time.perf_counter(); fn(x, None, params).block_until_ready(); compile_s = time.perf_counter() - t
        r = measure(lambda: fn(x, None, params).block_until_ready(), warmup=False)
        r["first_s"] = compile_s
    """,
}

TAIL = 'r["peak_increase_mb"] = (peak() - base) / 2**20\nprint("RESULT " + json.dumps(r))\n'

# (net, N, mode); N = 1024 rows are the memory comparison against the Jacobian contraction's peak
FULL_CASES = [
    ("conv_gap", 64, "full"),
    ("conv_gap", 1024, "full"),
    ("cifar_cnn", 128, "trace"),
    ("cifar_cnn", 128, "full"),
    ("cifar_cnn", 1024, "trace"),
    ("cifar_cnn", 1024, "full"),
    ("transformer", 128, "trace"),
    ("transformer", 128, "full"),
    ("transformer", 512, "trace"),
    ("mlp", 256, "full"),
]
QUICK_CASES = [
    ("conv_gap", 32, "full"),
    ("cifar_cnn", 32, "trace"),
    ("cifar_cnn", 32, "full"),
    ("transformer", 16, "trace"),
    ("mlp", 32, "full"),
]
METHODS = ("lazykern", "torch_func", "nngeometry", "neural_tangents")
# neural-tangents' structured derivatives took 34 s for the conv_gap block at N = 32 on 2 cores
# (its cost grows with N^2): rows above this size would each hit the timeout
NT_MAX_N = 128


SCALE_BLOCK = 2048
SCALE_SIZES = (1024, 4096, 16384, 30000)

# Peak anonymous memory (heap, tensors) by sampling /proc: VmHWM also counts the destination file's
# pages that the memory map has touched, which the kernel may evict at any time.
SCALE_COMMON = """
import json, os, threading, time, tempfile, torch
from torch import nn
torch.manual_seed(0)
N, MODE, SCRATCH = {n}, {mode!r}, {scratch!r}

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

class AnonPeak(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True); self.peak = status("RssAnon"); self.stop = False
    def run(self):
        while not self.stop:
            self.peak = max(self.peak, status("RssAnon")); time.sleep(0.02)
"""

SCALE_WORKERS = {
    "lazykern": """
        from lazykern.ntk import empirical_ntk
        empirical_ntk(net, x[:64], mode=MODE).to_dense()  # imports, rate probes
        path = os.path.join(SCRATCH, f"ntk-{N}.npy")
        base, anon = status("VmHWM"), status("RssAnon")
        sampler = AnonPeak(); sampler.start()
        t = time.perf_counter()
        K = empirical_ntk(net, x, mode=MODE, out=path, block_size=BLOCK, progress=False)
        seconds = time.perf_counter() - t
        sampler.stop = True; sampler.join()
        r = {"median_s": seconds, "peak_increase_mb": (status("VmHWM") - base) / 2**20,
             "anon_increase_mb": (sampler.peak - anon) / 2**20, "bytes_written": os.path.getsize(path),
             "first_entry_error": float(abs(K[0, 0] - empirical_ntk(net, x[:1], mode=MODE).to_dense()[0, 0]))}
        del K; os.remove(path); os.remove(path + ".progress.json")
    """,
    "torch_func": """
        from torch.func import functional_call, jacrev, vmap
        params = {k: p.detach() for k, p in net.named_parameters()}
        def f(p, xi):
            return functional_call(net, p, (xi[None],))[0]
        def ntk(x):
            jac = vmap(jacrev(f), (None, 0))(params, x)
            j = torch.cat([a.flatten(2) for a in jac.values()], dim=2); del jac
            return torch.einsum("iop,jop->ij", j, j)
        ntk(x[:64])  # warm-up
        base = status("VmHWM")
        t = time.perf_counter()
        K = ntk(x)
        r = {"median_s": time.perf_counter() - t, "peak_increase_mb": (status("VmHWM") - base) / 2**20}
    """,
    "lazykern_cg": """
        from lazykern import settings
        from lazykern.ntk import empirical_ntk
        from lazykern.solvers import cg
        from linear_operator.operators import DiagLinearOperator
        y = torch.randn(N, 1)
        base, anon = status("VmHWM"), status("RssAnon")
        sampler = AnonPeak(); sampler.start()
        t = time.perf_counter()
        with settings.max_dense_bytes(BUDGET or settings.max_dense_bytes.value()):
            K = empirical_ntk(net, x, mode="trace")
            A = K + DiagLinearOperator(torch.full((N,), float(K.diagonal().mean()) * 1e-2))
            _, result = cg(A, y, tol=1e-4, max_iter=ITERS)
        seconds = time.perf_counter() - t
        sampler.stop = True; sampler.join()
        r = {"median_s": seconds, "peak_increase_mb": (status("VmHWM") - base) / 2**20,
             "anon_increase_mb": (sampler.peak - anon) / 2**20, "iterations": result.iterations,
             "relative_residual": float(result.relative_residuals.max())}
    """,
}

SCALE_NETS = {
    "cifar_cnn": """
        net = nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        x = torch.randn(N, 3, 16, 16)
    """,
    "mlp": """
        net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        x = torch.randn(N, 784)
    """,
}

def scale(scratch: str, mlp_n: int, cg_n: int, cg_iters: int, cg_budget: int | None, sizes: tuple[int, ...],
          timeout: float, methods: tuple[str, ...] = ("lazykern", "torch_func")) -> list[dict]:
    """The large-N series (module docstring); one subprocess per cell under the address-space cap."""
    rows = []

    def cell(row: dict, body: str, mapped: int = 0) -> None:
        code = SCALE_COMMON.format(n=row["N"], mode=row["mode"], scratch=scratch)
        code += f"BLOCK, ITERS, BUDGET = {SCALE_BLOCK}, {cg_iters}, {cg_budget}\n"
        code += textwrap.dedent(body) + 'print("RESULT " + json.dumps(r))\n'
        row.update(_run(code, sys.executable, timeout, mapped))
        print(json.dumps(row), flush=True)
        rows.append(row)

    for n in sizes:
        for method in methods:
            cell({"method": method, "net": "cifar_cnn", "N": n, "mode": "trace"},
                 textwrap.dedent(SCALE_NETS["cifar_cnn"]) + textwrap.dedent(SCALE_WORKERS[method]),
                 mapped=4 * n * n if method == "lazykern" else 0)
    if cg_n:
        method = "lazykern_cg" if cg_budget is None else f"lazykern_cg (max_dense_bytes {cg_budget / 2**30:g} GiB)"
        cell({"method": method, "net": "cifar_cnn", "N": cg_n, "mode": "trace"},
             textwrap.dedent(SCALE_NETS["cifar_cnn"]) + textwrap.dedent(SCALE_WORKERS["lazykern_cg"]))
    if mlp_n:
        cell({"method": "lazykern", "net": "mlp", "N": mlp_n, "mode": "full"},
             textwrap.dedent(SCALE_NETS["mlp"]) + textwrap.dedent(SCALE_WORKERS["lazykern"]), mapped=4 * (10 * mlp_n) ** 2)
    return rows


def scale_markdown(rows: list[dict], note: str) -> str:
    lines = [f"float32, {platform.processor() or platform.machine()}, {os.cpu_count()} cores; one run per cell "
             f"(tiles of {SCALE_BLOCK} samples; time of the whole job; peak RSS increase includes the output "
             "file's pages mapped by the job, the anonymous peak does not; a cell that maps its output file "
             "has the cap raised by the file's size, which is address space, not memory)."
             + (f" {note}" if note else ""), "",
             "| net | N | mode | method | time (s) | peak RSS increase (MB) | anonymous peak increase (MB) | "
             "written (MB) | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['net']} | {r['N']} | {r['mode']} | {r['method']} | {r['status']} | | | | |")
            continue
        anon = f"{r['anon_increase_mb']:.0f}" if "anon_increase_mb" in r else ""
        written = f"{r['bytes_written'] / 2**20:.1f}" if "bytes_written" in r else ""
        note_ = (f"{r['iterations']} CG iterations, relative residual {r['relative_residual']:.1e}"
                 if "iterations" in r else "")
        lines.append(f"| {r['net']} | {r['N']} | {r['mode']} | {r['method']} | {r['median_s']:.1f} | "
                     f"{r['peak_increase_mb']:.0f} | {anon} | {written} | {note_} |")
    return "\n".join(lines) + "\n"


def scale_rst(rows: list[dict]) -> str:
    out = ['.. csv-table:: Large N: the kernel written to disk in tiles of 2,048 samples (float32, this machine)',
           '   :header: "net", "N", "mode", "method", "time (s)", "peak RSS increase (MB)", '
           '"anonymous peak increase (MB)", "written (MB)"', ""]
    for r in rows:
        ok = r["status"] == "ok"
        time_s = f"{r['median_s']:.1f}" if ok else r["status"].replace('"', "'")
        peak = f"{r['peak_increase_mb']:.0f}" if ok else ""
        anon = f"{r['anon_increase_mb']:.0f}" if ok and "anon_increase_mb" in r else ""
        written = f"{r['bytes_written'] / 2**20:.1f}" if ok and "bytes_written" in r else ""
        out.append(f'   {r["net"]}, {r["N"]}, {r["mode"]}, {r["method"]}, "{time_s}", "{peak}", "{anon}", "{written}"')
    return "\n".join(out) + "\n"


def _cap(extra: int = 0) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_CAP + extra, AS_CAP + extra))


def _python(method: str) -> str:
    return {"nngeometry": NNGEOMETRY_PYTHON, "neural_tangents": NT_PYTHON}.get(method, sys.executable)


def _code(method: str, net: str, n: int, mode: str, repeats: int) -> str | None:
    spec = NETS[net]
    common = COMMON.format(n=n, mode=mode, repeats=repeats, min_seconds=0 if repeats == 1 else 3)
    if method == "neural_tangents":
        if spec["stax"] is None:
            return None
        body = textwrap.dedent(WORKERS[method]).replace("{stax}", textwrap.indent(textwrap.dedent(spec["stax"]), ""))
        return common + body + TAIL
    return common + TORCH_SETUP + textwrap.dedent(spec["torch"]) + textwrap.dedent(WORKERS[method]) + TAIL


def _run(code: str, python: str, timeout: float, mapped: int = 0) -> dict:
    """Run a cell under the address-space cap, raised by ``mapped`` bytes for an output file the
    cell maps into memory (its address space, not memory: the pages go to the file)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
           "OMP_WAIT_POLICY": "PASSIVE"}
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, preexec_fn=lambda: _cap(mapped),
                             env=env)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout ({timeout:.0f} s)"}
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        err = out.stderr.strip().splitlines()
        if any("MemoryError" in l or "DefaultCPUAllocator" in l or "Cannot allocate" in l for l in err):
            return {"status": f"out of memory ({AS_CAP // 2**30} GB address-space cap)"}
        if out.returncode < 0:  # XLA segfaults when an allocation fails under the cap
            return {"status": f"killed by signal {-out.returncode} under the {AS_CAP // 2**30} GB address-space cap"}
        errors = [l for l in err if "Error" in l or "Exception" in l] or err[-1:]
        return {"status": f"failed: {errors[-1] if errors else out.returncode}"}
    return {"status": "ok", **json.loads(lines[-1][len("RESULT ") :])}


def run(method: str, net: str, n: int, mode: str, repeats: int, timeout: float) -> dict:
    row = {"method": method, "net": net, "N": n, "mode": mode}
    python = _python(method)
    if not Path(python).exists():
        return {**row, "status": f"skipped: {python} not found"}
    if method == "neural_tangents" and n > NT_MAX_N:
        return {**row, "status": f"not run (N > {NT_MAX_N}: hours on CPU)"}
    code = _code(method, net, n, mode, repeats)
    if code is None:
        return {**row, "status": "skipped: no stax equivalent"}
    return {**row, **_run(code, python, timeout)}


#: Methods whose first round's median is below this run a second round (its timed calls pooled with
#: the first's): at a fraction of a second a few seconds of a busy machine moved one method's median
#: by 30 % in one run; the slower cells are many repeats' worth of seconds, and nngeometry's minute.
SECOND_ROUND_BELOW_S = 10.0


def pooled(first: dict, second: dict) -> dict:
    """One row from two rounds of a method: the median over both rounds' timed calls, the larger peak."""
    if second["status"] != "ok":
        return {**first, "second_round": second["status"]}
    times = first["times_s"] + second["times_s"]
    return {**first, "times_s": times, "median_s": statistics.median(times), "rounds": 2,
            "peak_increase_mb": max(first["peak_increase_mb"], second["peak_increase_mb"])}


CONV_RULE = """
import torch, statistics, time
from torch import nn
from lazykern.ntk import empirical_ntk
torch.manual_seed(0)
N, C, S = {n}, {c}, {s}
net = nn.Sequential(nn.Conv2d(C, C, 3, padding=1), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(C, 10))
net[-1].requires_grad_(False)  # the convolution alone is trainable
x = torch.randn(N, C, S, S)
out = {{"predicted": empirical_ntk(net, x, mode="{mode}", plan=True).pieces[0].form}}
work = {{f: empirical_ntk(net, x, mode="{mode}", forms=f, plan=True).kernel_macs() for f in ("implicit", "explicit")}}
out["work_ratio"] = work["implicit"] / work["explicit"]
for form in ("implicit", "explicit"):
    if work[form] > 30 * min(work.values()):  # far from the crossover: hours, and nothing to learn
        out[form] = None
        continue
    fn = lambda: empirical_ntk(net, x, mode="{mode}", forms=form, backend="dense").to_dense()
    fn()
    times = []
    for _ in range({repeats}):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    out[form] = statistics.median(times)
print("RESULT " + __import__("json").dumps(out))
"""

CONV_RULE_CASES = [(4, 28), (8, 16), (16, 8), (32, 8), (64, 4), (128, 2)]


def conv_rule(quick: bool) -> list[dict]:
    rows = []
    n, repeats = (16, 1) if quick else (64, 3)
    for mode in ("full", "trace"):
        for c, s in CONV_RULE_CASES[:3] if quick else CONV_RULE_CASES:
            code = CONV_RULE.format(n=n, c=c, s=s, mode=mode, repeats=repeats)
            r = _run(code, sys.executable, 1800)
            row = {"channels": c, "map": s, "N": n, "mode": mode, **r}
            if r["status"] == "ok":
                timed = [f for f in ("implicit", "explicit") if r[f] is not None]
                row["measured"] = min(timed, key=lambda f: r[f]) if len(timed) == 2 else f"{timed[0]} (other >30x work)"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _seconds(value: float | None) -> str:
    return "not timed" if value is None else f"{value:.3f}"


def markdown(rows: list[dict], rule_rows: list[dict], quick: bool, note: str = "", rule_run: str = "") -> str:
    lines = [
        f"float32, {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
        + (" (--quick: small sizes, one repeat)" if quick else "")
        + ". Median wall time (first call in brackets); peak RSS increase over the process after setup."
        + (f" {note}" if note else ""),
        "",
    ]
    for net in NETS:
        net_rows = [r for r in rows if r["net"] == net]
        if not net_rows:
            continue
        lines += [f"**{net}**: {NETS[net]['title']}", "", "| N | mode | method | median time (s) | peak RSS increase (MB) |",
                  "|---|---|---|---|---|"]
        for r in net_rows:
            if r["status"] != "ok":
                lines.append(f"| {r['N']} | {r['mode']} | {r['method']} | {r['status']} | |")
                continue
            first = "" if r.get("first_s") is None else f" ({r['first_s']:.2f})"
            lines.append(f"| {r['N']} | {r['mode']} | {r['method']} | {r['median_s']:.3f}{first} | {r['peak_increase_mb']:.0f} |")
        lines.append("")
    if rule_rows:
        lines += ["**Convolution cost rule**: Conv2d(C→C, 3×3, pad 1) on S×S, the convolution alone trainable, "
                  "whole block on the torch engine; a form predicted to need over 30 times the other's work "
                  f"is not timed.{f' Sweep: {rule_run}.' if rule_run else ''}", "",
                  "| C | S | N | mode | implicit/explicit work | implicit (s) | explicit (s) | faster | rule picks |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rule_rows:
            if r["status"] != "ok":
                lines.append(f"| {r['channels']} | {r['map']} | {r['N']} | {r['mode']} | {r['status']} | | | | |")
                continue
            lines.append(f"| {r['channels']} | {r['map']} | {r['N']} | {r['mode']} | {r['work_ratio']:.2g} | "
                         f"{_seconds(r['implicit'])} | {_seconds(r['explicit'])} | {r['measured']} | {r['predicted']} |")
    return "\n".join(lines) + "\n"


def rst(rows: list[dict], rule_rows: list[dict]) -> tuple[str, str]:
    """The tables for the docs (included by docs/ntk.rst): one per network, and the rule check."""
    out = []
    for net in NETS:
        net_rows = [r for r in rows if r["net"] == net]
        if not net_rows:
            continue
        out += [f".. csv-table:: {NETS[net]['title']}", '   :header: "N", "mode", "method", "median time (s)", '
                '"peak RSS increase (MB)"', ""]
        for r in net_rows:
            ok = r["status"] == "ok"
            time_s = f"{r['median_s']:.3f}" if ok else r["status"].replace('"', "'")
            memory = f"{r['peak_increase_mb']:.0f}" if ok else ""
            out.append(f'   {r["N"]}, {r["mode"]}, {r["method"]}, "{time_s}", "{memory}"')
        out.append("")
    rule = ['.. csv-table:: Conv2d(C→C, 3×3, pad 1) on S×S maps, the convolution alone trainable, whole block',
            '   :header: "C", "S", "N", "mode", "implicit/explicit work", "implicit (s)", "explicit (s)", "faster", '
            '"rule picks"', ""]
    for r in rule_rows:
        if r["status"] == "ok":
            rule.append(f'   {r["channels"]}, {r["map"]}, {r["N"]}, {r["mode"]}, {r["work_ratio"]:.2g}, '
                        f'"{_seconds(r["implicit"])}", "{_seconds(r["explicit"])}", "{r["measured"]}", {r["predicted"]}')
        else:  # as in the markdown table: a csv-table without rows does not build
            status = r["status"].replace('"', "'")
            rule.append(f'   {r["channels"]}, {r["map"]}, {r["N"]}, {r["mode"]}, "{status}", "", "", "", ""')
    return "\n".join(out) + "\n", "\n".join(rule) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--conv-rule", action="store_true", help="also time both forms of single convolutions")
    parser.add_argument("--only", nargs="*", choices=list(NETS), help="networks to run")
    parser.add_argument("--methods", nargs="*", choices=METHODS, default=list(METHODS))
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile (printed with the tables)")
    parser.add_argument("--render", action="store_true", help="only rewrite the tables from the JSON results")
    parser.add_argument("--scale", action="store_true", help="the large-N series instead (module docstring)")
    parser.add_argument("--sizes", nargs="*", type=int, default=list(SCALE_SIZES), help="--scale: the CNN's N")
    parser.add_argument("--mlp-n", type=int, default=10_000, help="--scale: samples of the full-mode MLP (0: none)")
    parser.add_argument("--cg-n", type=int, default=30_000, help="--scale: samples of the CG solve (0: none)")
    parser.add_argument("--cg-iters", type=int, default=3, help="--scale: CG iterations timed (default 3)")
    parser.add_argument("--cg-budget-gib", type=float, default=None,
                        help="--scale: max_dense_bytes for the CG solve (default: lazykern's default)")
    parser.add_argument("--append", action="store_true",
                        help="--scale: merge these cells into the existing results (same cell: replaced)")
    parser.add_argument("--scratch", default=None, help="--scale: folder for the kernel files (default: a temporary one)")
    args = parser.parse_args()
    if args.scale:
        import tempfile

        with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
            started = time.time()
            budget = None if args.cg_budget_gib is None else int(args.cg_budget_gib * 2**30)
            methods = tuple(m for m in ("lazykern", "torch_func") if m in args.methods)
            rows = scale(scratch, args.mlp_n, args.cg_n, args.cg_iters, budget, tuple(args.sizes), timeout=7200,
                         methods=methods)
        payload = {"machine": {"processor": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                               "wall_s": time.time() - started, "note": args.note}, "rows": rows}
        if args.append and (RESULTS / "ntk_scale.json").exists():
            last = json.loads((RESULTS / "ntk_scale.json").read_text())
            key = lambda r: (r["method"], r["net"], r["N"], r["mode"])  # noqa: E731
            new = {key(r) for r in rows}
            rows = sorted([r for r in last["rows"] if key(r) not in new] + rows,
                          key=lambda r: (r["net"] != "cifar_cnn", r["method"].startswith("lazykern_cg"), r["N"],
                                         r["method"]))
            payload = {**last, "rows": rows, "appended": payload["machine"]}
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "ntk_scale.json").write_text(json.dumps(payload, indent=2) + "\n")
        text = scale_markdown(rows, args.note)
        (RESULTS / "ntk_scale.md").write_text(text)
        (RESULTS / "ntk_scale.rst").write_text(scale_rst(rows))
        print(text)
        return
    if args.render:
        payload = json.loads((RESULTS / "ntk.json").read_text())
        write(payload, quick=False)
        return
    cases = QUICK_CASES if args.quick else FULL_CASES
    repeats, timeout = (1, 600) if args.quick else (3, 1800)
    rows = []
    started = time.time()
    for net, n, mode in cases:
        if args.only and net not in args.only:
            continue
        case_rows = {method: run(method, net, n, mode, repeats, timeout) for method in args.methods}
        if not args.quick:  # a second round in reverse order, so that a slow spell of the machine hits every method
            for method in reversed(args.methods):
                if case_rows[method]["status"] == "ok" and case_rows[method]["median_s"] < SECOND_ROUND_BELOW_S:
                    case_rows[method] = pooled(case_rows[method], run(method, net, n, mode, repeats, timeout))
        for row in case_rows.values():
            print(json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)
            rows.append(row)
    rule_rows = conv_rule(args.quick) if args.conv_rule else []
    rule_run = f"{time.strftime('%Y-%m-%d')}, this run"
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not rule_rows and not args.quick and (RESULTS / "ntk.json").exists():  # keep the last sweep's, and say so
        last = json.loads((RESULTS / "ntk.json").read_text())
        rule_rows, rule_run = last.get("conv_rule", []), last.get("conv_rule_run", "an earlier run")
        rule_run = rule_run.replace("this run", "an earlier run")
    payload = {"machine": {"processor": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "wall_s": time.time() - started, "note": args.note}, "rows": rows, "conv_rule": rule_rows,
               "conv_rule_run": rule_run}
    print(write(payload, args.quick))


def write(payload: dict, quick: bool) -> str:
    """Write the JSON results and the tables; return the markdown."""
    stem = "ntk_quick" if quick else "ntk"
    rows, rule_rows = payload["rows"], payload["conv_rule"]
    text = markdown(rows, rule_rows, quick, payload["machine"].get("note", ""), payload.get("conv_rule_run", ""))
    (RESULTS / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(text)
    if not quick:
        nets_rst, rule_rst = rst(rows, rule_rows)
        (RESULTS / "ntk.rst").write_text(nets_rst)
        if rule_rows:
            (RESULTS / "ntk_conv_rule.rst").write_text(rule_rst)
    return text


if __name__ == "__main__":
    main()
