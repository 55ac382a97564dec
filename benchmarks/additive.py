"""Additive GP kernels, d=26: lazykern against the ways GPyTorch users write them today.

For every (method, N, dtype, task) one fresh subprocess, under a hard address-space cap
(``RLIMIT_AS``), builds an exact GP with ``ScaleKernel(<additive RBF>)`` and times

* ``mll``: one negative marginal log likelihood forward + backward (GPyTorch defaults: CG and
  Lanczos above ``max_cholesky_size`` = 800), or
* ``matvec``: one kernel matvec ``K(X, X) @ V`` with 12 right-hand sides (no grad),

after one untimed warm-up on at most 1000 points (KeOps compiles, lazy imports). A method whose
predicted peak memory exceeds the cap is not started and is recorded as
``out of memory (estimated X GB)``; one that hits the cap is recorded as out of memory too.

Methods:

* ``lazykern``: :class:`lazykern.AdditiveStructureKernel` over :class:`lazykern.RBFKernel`, default
  settings (the N x N matrix is formed once when it fits ``max_dense_bytes``, else pure KeOps);
* ``lazykern-lazy``: the same, forced lazy (``max_dense_bytes(0)``: O(N d) memory);
* ``lazykern-keops``: default settings with every reduction on KeOps (``settings.engine("keops")``;
  on a CPU, what lazykern did before its own CPU engine; on a GPU the same as ``lazykern``);
* ``gpytorch-structure``: ``gpytorch.kernels.AdditiveStructureKernel(RBFKernel(), num_dims=d)``;
* ``gpytorch-sum``: ``AdditiveKernel`` of d ``RBFKernel(active_dims=[i])``;
* ``gpytorch-batch``: the tutorial recipe, ``RBFKernel(batch_shape=[d])`` on ``x.mT.unsqueeze(-1)``,
  summed over the batch (``.sum(-3)``);
* ``gpytorch-batch-keops``: the same recipe with ``gpytorch.kernels.keops.RBFKernel``;
* ``looped``: a custom kernel whose forward loops over dimensions, adding
  :math:`\\exp(-\\tfrac12 (x_d - x'_d)^2 / \\ell_d^2)` into one N x N tensor (the usual workaround).

Usage (a smoke run takes about a minute)::

    python benchmarks/additive.py --sizes 1000 --dtypes float32 --repeats 1 --tasks matvec
    python benchmarks/additive.py --quick       # N = 2000 and 5000, float32, the main peers (docs)
    python benchmarks/additive.py               # the full suite, writes benchmarks/results/additive.*

The summary under the table checks the performance goals in the same run: at N = 5000 the MLL
step against the fastest GPyTorch recipe (time, and memory growth above the interpreter's
baseline), and at the largest N the MLL step in units of one lazy 12-column pass.

Data: the UCI ``pol`` inputs (standardized, first N rows of a fixed shuffle) when found under
``LAZYKERN_DATA`` or ``../shared/uci``, else standard normal inputs; ``--data`` forces either.
Results: ``<out>/<name>.json`` (everything), ``.md`` (table), ``.rst`` (the table for the docs) and
``.png`` (time and peak memory against N).
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
D = 26
RHS = 12
WARMUP_POINTS = 1000
METHODS = (
    "lazykern",
    "lazykern-lazy",
    "lazykern-keops",
    "gpytorch-structure",
    "gpytorch-sum",
    "gpytorch-batch",
    "gpytorch-batch-keops",
    "looped",
)
TASKS = ("mll", "matvec")
SIZES = (2000, 5000, 10000, 13500)
DTYPES = ("float32", "float64")


# ---------------------------------------------------------------------------- memory model
def estimated_peak_bytes(method: str, task: str, n: int, d: int, itemsize: int) -> int:
    """Predicted peak memory of one run, from what each method stores (plus the interpreter).

    The N x N x d methods hold the d x N x N tensor and, for a backward pass, a few more of its
    size (differences, exponentials saved by autograd); the N x N methods a few N x N matrices
    (d of them for the autograd record of the loop); the lazy ones O(N d).
    """
    base = 600 * 2**20
    nn, nnd = n * n * itemsize, n * n * d * itemsize
    backward = task == "mll"
    if method in ("gpytorch-structure", "gpytorch-batch"):
        return base + nnd * (3 if backward else 2)
    if method == "gpytorch-sum":
        return base + nn * (2 * d if backward else 3)
    if method == "looped":
        return base + nn * (d + 4 if backward else 3)
    if method in ("lazykern", "lazykern-keops"):
        return base + nn * 2
    return base + 64 * n * d * itemsize  # lazykern-lazy, gpytorch-batch-keops


# ---------------------------------------------------------------------------- the child
def _inputs(n: int, dtype, data: str):
    import numpy as np
    import torch

    if data == "pol":
        table = np.loadtxt(_pol_path(), delimiter=",", dtype=np.float64)
        table = table[np.random.default_rng(0).permutation(len(table))][:n]
        x, y = table[:, :-1], table[:, -1]
        std = x.std(0)
        x = (x - x.mean(0)) / np.where(std > 0, std, 1.0)
        y = (y - y.mean()) / y.std()
        if len(x) < n:
            raise ValueError(f"pol has only {len(x)} rows, asked for {n}")
        return torch.as_tensor(x, dtype=dtype), torch.as_tensor(y, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, D, generator=gen, dtype=torch.float64)
    y = torch.sin(x[:, :4]).sum(-1) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def _pol_path() -> Path:
    base = Path(os.environ.get("LAZYKERN_DATA", ROOT.parent / "shared" / "uci"))
    return base / "pol" / "data.csv.gz"


def _covariance(method: str, d: int):
    """``(module, covariance)``: the module holding the hyperparameters and ``x -> K(x, x)``."""
    import gpytorch
    import torch

    import lazykern

    class Looped(gpytorch.kernels.Kernel):
        """The usual workaround: loop over dimensions into one N x M tensor."""

        has_lengthscale = True

        def forward(self, x1, x2, diag=False, **params):
            if diag:
                return torch.full(x1.shape[:-1], float(x1.shape[-1]), dtype=x1.dtype, device=x1.device)
            ls = self.lengthscale.reshape(-1)
            out = torch.zeros(x1.shape[-2], x2.shape[-2], dtype=x1.dtype, device=x1.device)
            for i in range(x1.shape[-1]):
                diff = (x1[:, i : i + 1] - x2[:, i].unsqueeze(0)) / ls[i]
                out = out + torch.exp(-0.5 * diff * diff)
            return out

    if method.startswith("lazykern"):
        base = lazykern.RBFKernel(ard_num_dims=d)
        inner = lazykern.AdditiveStructureKernel(base, num_dims=d)
    elif method == "gpytorch-structure":
        inner = gpytorch.kernels.AdditiveStructureKernel(gpytorch.kernels.RBFKernel(), num_dims=d)
    elif method == "gpytorch-sum":
        inner = gpytorch.kernels.AdditiveKernel(*[gpytorch.kernels.RBFKernel(active_dims=[i]) for i in range(d)])
    elif method in ("gpytorch-batch", "gpytorch-batch-keops"):
        # GPyTorch's tutorial recipe: a batch of d one-dimensional kernels, summed over the batch.
        kernels = gpytorch.kernels.keops if method.endswith("keops") else gpytorch.kernels
        module = gpytorch.kernels.ScaleKernel(kernels.RBFKernel(batch_shape=torch.Size([d])))
        return module, lambda x: module(x.mT.unsqueeze(-1)).sum(-3)
    elif method == "looped":
        inner = Looped(ard_num_dims=d)
    else:
        raise ValueError(f"unknown method {method!r}")
    module = gpytorch.kernels.ScaleKernel(inner)
    return module, module


def _status_mb(field: str = "VmHWM") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(spec: dict) -> dict:
    import contextlib

    import gpytorch
    import torch

    import lazykern

    torch.manual_seed(0)
    dtype = getattr(torch, spec["dtype"])
    device = torch.device(spec["device"])
    x, y = (t.to(device) for t in _inputs(spec["n"], dtype, spec["data"]))
    module, covariance = _covariance(spec["method"], x.shape[-1])

    class GP(gpytorch.models.ExactGP):
        def __init__(self, xs, ys):
            super().__init__(xs, ys, gpytorch.likelihoods.GaussianLikelihood())
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = module

        def forward(self, xs):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(xs), covariance(xs))

    model = GP(x, y).to(device=device, dtype=dtype)
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    settings = contextlib.ExitStack()
    if spec["method"] == "lazykern-lazy":
        settings.enter_context(lazykern.settings.max_dense_bytes(0))
    if spec["method"] == "lazykern-keops":
        settings.enter_context(lazykern.settings.engine("keops"))

    def run(xs, ys):
        if spec["task"] == "mll":
            model.set_train_data(xs, ys, strict=False)
            loss = -mll(model(xs), ys)
            loss.backward()
            model.zero_grad()
            return float(loss)
        v = torch.randn(xs.shape[0], RHS, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(device)
        with torch.no_grad():
            return float((covariance(xs) @ v).sum())

    baseline_mb = _status_mb("VmRSS")  # interpreter, libraries and data, before any kernel work
    times = []
    with settings:
        m = min(WARMUP_POINTS, spec["n"])
        run(x[:m], y[:m])
        passes = _count_passes(lambda: run(x, y)) if spec["method"].startswith("lazykern") else None
        for _ in range(spec["repeats"]):
            _synchronize(device)
            start = time.perf_counter()
            value = run(x, y)
            _synchronize(device)
            times.append(time.perf_counter() - start)
    result = {"times": times, "value": value, "peak_mb": _status_mb(), "baseline_mb": baseline_mb, "passes": passes}
    if device.type == "cuda":
        # On a GPU the memory that matters is the device's; host RSS is kept as host_peak_mb.
        result.update(host_peak_mb=result["peak_mb"], peak_mb=torch.cuda.max_memory_allocated(device) / 2**20)
    return result


def _count_passes(step) -> dict:
    """What one run of ``step`` asks of lazykern's engines: calls and seconds per pairwise pass
    (an untimed extra run: the counting wrappers add a little overhead)."""
    from lazykern import backend
    from lazykern.torch_engine import engine as torch_engine

    counts: dict = {}

    def counted(owner, name, label):
        """Wrap ``owner.name`` (a module's function or an engine's method) with a counter."""
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                entry = counts.setdefault(label, {"calls": 0, "seconds": 0.0})
                entry["calls"] += 1
                entry["seconds"] = round(entry["seconds"] + time.perf_counter() - start, 4)

        own = name in vars(owner)  # a module's function; else an engine's method, shadowed on the instance
        setattr(owner, name, wrapper)
        return owner, name, original if own else None

    patched = [
        counted(backend.CPU, "matmul", "cpu product (forward + backward)"),
        counted(backend.CPU, "dense", "cpu dense build"),
        counted(backend.CPU, "symmetric_gradients", "cpu fused gradient"),
        counted(backend.KEOPS, "matmul", "keops product"),
        counted(torch_engine, "rowwise", "torch row blocks"),
    ]
    try:
        step()
    finally:
        for owner, name, original in patched:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
    return counts


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------- the parent
def machine(device: str = "cpu") -> dict:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    meminfo = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            meminfo[key] = int(value.split()[0]) * 1024
    import torch

    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    return {
        "gpu": gpu,
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gb": round(meminfo["MemTotal"] / 2**30, 1),
        "available_gb_at_start": round(meminfo["MemAvailable"] / 2**30, 1),
        "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def run_one(spec: dict, cap_bytes: int, timeout: float) -> dict:
    itemsize = 4 if spec["dtype"] == "float32" else 8
    estimate = estimated_peak_bytes(spec["method"], spec["task"], spec["n"], D, itemsize)
    record = dict(spec, estimated_gb=round(estimate / 2**30, 2))
    if estimate > cap_bytes:
        return dict(record, status=f"out of memory (estimated {estimate / 2**30:.1f} GB)")
    # The project first, then whatever the caller's PYTHONPATH holds (e.g. wheels unpacked there).
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYKEOPS_VERBOSE="0", PYTHONPATH=pythonpath)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    try:
        # CUDA reserves far more address space than it uses, so on a GPU the cap is only predictive.
        proc = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            env=env, preexec_fn=cap if spec["device"] == "cpu" else None, capture_output=True, text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return dict(record, status=f"timeout (> {timeout:.0f} s)")
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode == 0 and lines:
        result = json.loads(lines[-1][7:])
        return dict(record, status="ok", median_s=statistics.median(result["times"]), **result)
    tail = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
    if any(s in proc.stderr for s in ("MemoryError", "bad_alloc", "DefaultCPUAllocator", "CUDA out of memory")) \
            or proc.returncode in (-9, 137):
        return dict(record, status=f"out of memory (hit the {cap_bytes / 2**30:.0f} GB cap)")
    return dict(record, status=f"error: {tail[0][:200]}")


def add_ratios(records: list[dict]) -> None:
    """Each method's median time and peak memory relative to lazykern's in the same run."""
    reference = {
        (r["task"], r["n"], r["dtype"]): r for r in records if r["method"] == "lazykern" and r["status"] == "ok"
    }
    for r in records:
        ref = reference.get((r["task"], r["n"], r["dtype"]))
        if r["status"] == "ok" and ref is not None:
            r["time_ratio"] = r["median_s"] / ref["median_s"]
            r["memory_ratio"] = r["peak_mb"] / ref["peak_mb"]


def _cells(r: dict) -> list[str]:
    if r["status"] != "ok":
        return [r["status"], "", "", "", ""]
    return [f"{r['median_s']:.3f}", f"{r.get('time_ratio', float('nan')):.2f}", f"{r['peak_mb']:.0f}",
            f"{r.get('memory_ratio', float('nan')):.2f}", f"{r.get('baseline_mb', float('nan')):.0f}"]


def goals(records: list[dict]) -> list[str]:
    """Same-run checks of lazykern's performance goals (docs/performance.rst), one line each."""
    ok = {(r["task"], r["dtype"], r["n"], r["method"]): r for r in records if r["status"] == "ok"}
    peers = [m for m in METHODS if m.startswith(("gpytorch", "looped"))]
    lines = []
    for dtype in sorted({r["dtype"] for r in records}):
        ours = ok.get(("mll", dtype, 5000, "lazykern"))
        theirs = [ok[k] for k in ((("mll", dtype, 5000, m)) for m in peers) if k in ok]
        if ours and theirs:
            best = min(theirs, key=lambda r: r["median_s"])
            growth = (ours["peak_mb"] - ours["baseline_mb"]) / max(1.0, best["peak_mb"] - best["baseline_mb"])
            lines.append(
                f"- {dtype}, N = 5000: MLL step {best['median_s'] / ours['median_s']:.1f}x faster than the fastest "
                f"GPyTorch recipe ({best['method']}, {best['median_s']:.2f} s vs {ours['median_s']:.2f} s; goal >= 4x), "
                f"memory growth {100 * growth:.0f}% of its (goal <= 10%)."
            )
        n = max((r["n"] for r in records if r["dtype"] == dtype), default=None)
        step, lazy = ok.get(("mll", dtype, n, "lazykern")), ok.get(("matvec", dtype, n, "lazykern-lazy"))
        if step and lazy:
            lines.append(
                f"- {dtype}, N = {n}: MLL step {step['median_s']:.2f} s = {step['median_s'] / lazy['median_s']:.1f} lazy "
                f"12-column passes ({lazy['median_s']:.3f} s each; goal <= 52, i.e. 2x 26 passes)."
            )
    return lines


def markdown(records: list[dict], meta: dict) -> str:
    lines = [
        f"Machine: {meta['machine']['gpu'] or ''}{' on ' if meta['machine']['gpu'] else ''}{meta['machine']['cpu']}, "
        f"{meta['machine']['cores']} cores, {meta['machine']['memory_gb']} GB; "
        f"data: {meta['data']}; d={D}; median of {meta['repeats']} runs; memory cap {meta['cap_gb']} GB per run; "
        f"load average at start {meta['machine']['load_average_at_start'][0]:.1f}. {meta['note']}",
        "",
        "| task | dtype | N | method | median time (s) | × lazykern | peak memory (MB) | × lazykern "
        "| before kernel work (MB) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        cells = _cells(r)
        lines.append(f"| {r['task']} | {r['dtype']} | {r['n']} | {r['method']} | " + " | ".join(cells) + " |")
    summary = goals(records)
    if summary:
        lines += ["", "Goals, same run:", "", *summary]
    return "\n".join(lines) + "\n"


def rst_table(records: list[dict]) -> str:
    """The results as a reStructuredText ``csv-table`` (included by docs/performance.rst)."""
    lines = [
        ".. csv-table::",
        '   :header: "task", "dtype", "N", "method", "median time (s)", "× lazykern", "peak memory (MB)", '
        '"× lazykern", "before kernel work (MB)"',
        "",
    ]
    for r in records:
        cells = _cells(r)
        row = [r["task"], r["dtype"], str(r["n"]), r["method"], *cells]
        lines.append("   " + ", ".join('"' + c.replace('"', "'") + '"' for c in row))
    return "\n".join(lines) + "\n"


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r["dtype"] for r in records})
    tasks = [t for t in TASKS if any(r["task"] == t for r in records)]
    fig, axes = plt.subplots(len(tasks) * len(dtypes), 2, figsize=(11, 3.6 * len(tasks) * len(dtypes)), squeeze=False)
    for row, (task, dtype) in enumerate((t, dt) for t in tasks for dt in dtypes):
        for method in METHODS:
            ok = sorted((r["n"], r["median_s"], r["peak_mb"]) for r in records
                        if r["method"] == method and r["task"] == task and r["dtype"] == dtype and r["status"] == "ok")
            if ok:
                n, t, m = zip(*ok)
                axes[row, 0].plot(n, t, "o-", label=method)
                axes[row, 1].plot(n, [v / 1024 for v in m], "o-", label=method)
        axes[row, 0].set(title=f"{task}, {dtype}: time", xlabel="N", ylabel="seconds", yscale="log")
        axes[row, 1].set(title=f"{task}, {dtype}: peak memory", xlabel="N", ylabel="GB", yscale="log")
        axes[row, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cap-gb", type=float, default=10.0,
                        help="memory cap per run (GB): the address-space limit on CPU, the predicted-memory limit on GPU")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--data", choices=("auto", "pol", "random"), default="auto")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for additive.{json,md,png}")
    parser.add_argument("--name", default="additive", help="file name stem of the results")
    parser.add_argument("--note", default="", help="free text stored with the results (e.g. machine load)")
    parser.add_argument("--quick", action="store_true",
                        help="N = 2000 and 5000, float32, one repeat, lazykern and the two fastest GPyTorch "
                        "recipes (results named additive-quick unless --name is given)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.dtypes, args.repeats = [2000, 5000], ["float32"], 1
        args.methods = ["lazykern", "lazykern-lazy", "gpytorch-structure", "gpytorch-sum"]
        if args.name == "additive":
            args.name = "additive-quick"

    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return

    data = args.data if args.data != "auto" else ("pol" if _pol_path().exists() else "random")
    cap_bytes = int(args.cap_gb * 2**30)
    meta = {"machine": machine(args.device), "data": data, "repeats": args.repeats, "cap_gb": args.cap_gb,
            "note": args.note, "keops_flags": _keops_flags()}
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for task in args.tasks:
        for dtype in args.dtypes:
            for n in args.sizes:
                for method in args.methods:
                    spec = {"method": method, "task": task, "n": n, "dtype": dtype, "repeats": args.repeats,
                            "data": data, "device": args.device}
                    record = run_one(spec, cap_bytes, args.timeout)
                    records.append(record)
                    # Saved after every run, so an interrupted suite keeps what it measured.
                    (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
                    shown = f"{record['median_s']:.3f} s, {record['peak_mb']:.0f} MB" if record["status"] == "ok" else record["status"]
                    print(f"{task:6s} {dtype} N={n:6d} {method:22s} {shown}", flush=True)
    add_ratios(records)
    (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(records, meta))
    (args.out / f"{args.name}.rst").write_text(rst_table(records))
    plot(records, args.out / f"{args.name}.png")
    print(f"wrote {args.out / args.name}.{{json,md,rst,png}}")


def _keops_flags() -> str:
    from lazykern.keops import compile_flags

    return compile_flags()


if __name__ == "__main__":
    main()
