"""The lazy pass against a hand-written roofline, and the dense build against the lazy pass.

One additive RBF reduction over N x N pairs, d = 26 (the UCI ``pol`` inputs when found, else
standard normal), C right-hand sides, float32 and float64, measured as pair.dim/s = N * N * d / s:

* ``reference``: ``benchmarks/roofline_ref.c`` (OpenMP over rows, SIMD over blocks of points with
  dimension-major inputs, ``-O3 -march=native -ffast-math``), compiled by this script;
* ``keops``: ``lazykern.backend.pairwise_matmul`` forced onto KeOps (12 columns padded to 16, as
  lazykern's KeOps path pads), and ``keops-unpadded`` (the same reduction with 12 columns);
* ``engine``: ``lazykern.cpu.ENGINE.matmul`` (lazykern's own CPU engine; no padding needed);
* ``dense-engine`` / ``dense-torch``: the N x N matrix from ``lazykern.cpu.ENGINE.dense`` and from today's
  torch engine, ``lazykern.backend.pairwise_dense``; ``first_s`` is the first full-size build in
  the process (as in a training step: formulas compiled before, on 1000 points);
* ``grad-engine`` / ``grad-keops``: the fused gradient pass of a training step,
  ``symmetric_gradients`` (x and the 26 scales) on each engine;
* ``paired``: reference, engine, KeOps and the engine's dense build called in turn in ONE process,
  round after round; the median of each round's ratio is the steadiest same-run comparison on a
  shared machine (the reference library is linked without ``-ffast-math``, so loading it changes no
  float mode: checked). Before the rounds, the process's first dense builds (engine, torch) are
  each timed between two lazy passes (engine, KeOps);
* compile seconds of each engine pass for every stationary formula (d = 26, float32), into an empty
  cache.

Every measurement runs in a fresh subprocess (the reference too, so nothing it loads can touch the
others), with one untimed warm-up at 1000 points, then ``--repeats`` timed calls: the median of
wall and of CPU seconds is reported with the load average. The machine may be shared: compare the
ratios of one run (CPU seconds are the steadier measure under load), not absolute numbers.

Goals (docs/performance.rst): engine >= 0.9x the reference; the first dense build <= 2x one lazy 12-column pass.

Usage::

    python benchmarks/roofline.py --n 1000 --repeats 1      # smoke run, about a minute
    python benchmarks/roofline.py                           # N = 5000, writes benchmarks/results/roofline.*
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from additive import _inputs, _pol_path, machine  # noqa: E402  (one data loader for the benchmarks)

RESULTS = ROOT / "benchmarks" / "results"
REFERENCE_SOURCE = ROOT / "benchmarks" / "roofline_ref.c"
D = 26
WARMUP_POINTS = 1000
BLOCK = 64  # B in roofline_ref.c
METHODS = ("reference", "keops", "keops-unpadded", "engine", "dense-engine", "dense-torch", "grad-engine", "grad-keops",
           "paired")
DTYPES = ("float32", "float64")


# ---------------------------------------------------------------------------- the worker
def _reference_library(folder: Path) -> ctypes.CDLL:
    obj, lib = folder / "roofline_ref.o", folder / "roofline_ref.so"
    compile_ = ["gcc", "-c", "-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", str(REFERENCE_SOURCE), "-o", str(obj)]
    link = ["gcc", "-shared", "-fopenmp", str(obj), "-o", str(lib), "-lm"]  # no -ffast-math: no crtfastmath.o
    for cmd in (compile_, link):
        subprocess.run(cmd, check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def _timed(fn, repeats: int) -> dict:
    """The first call (e.g. the first dense build of the process) and the medians of ``repeats`` more."""
    walls, cpus, loads = [], [], []
    for _ in range(repeats + 1):
        loads.append(os.getloadavg()[0])
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {
        "first_s": walls[0],
        "median_s": statistics.median(walls[1:] or walls),
        "median_cpu_s": statistics.median(cpus[1:] or cpus),
        "load": loads[0],
    }


def _maker(method: str, dtype_name: str, c: int, n: int, data: str):
    """``make(k)``: a no-argument callable running ``method`` on the first ``k`` points."""
    import torch

    from lazykern import backend, cpu, settings
    from lazykern.formulas import StationaryFormula
    from lazykern.keops import keops_lazy_tensor, keops_session

    dtype = getattr(torch, dtype_name)
    x, _ = _inputs(max(n, WARMUP_POINTS), torch.float64, data)
    x = (x / 2.0).to(dtype)[: max(n, WARMUP_POINTS)].contiguous()  # lengthscale 2 on standardized inputs
    gen = torch.Generator().manual_seed(1)
    scales = (torch.rand(1, D, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    v = torch.randn(x.shape[0], c, generator=gen, dtype=torch.float64).to(dtype)
    w = torch.randn(x.shape[0], c, generator=gen, dtype=torch.float64).to(dtype)
    formula = StationaryFormula("rbf", additive=True)

    def pick(k: int):
        return x[:k].contiguous(), v[:k].contiguous()

    if method == "reference":
        folder = Path(tempfile.mkdtemp(prefix="lazykern-roofline-"))
        fn = getattr(_reference_library(folder), f"reference_{dtype_name}")

        def make(k: int):
            xk, vk = pick(k)
            mp = -(-k // BLOCK) * BLOCK
            x2t = torch.zeros(D, mp, dtype=dtype)
            x2t[:, :k] = xk.T
            vt = torch.zeros(c, mp, dtype=dtype)
            vt[:, :k] = vk.T
            out = torch.empty(k, c, dtype=dtype)
            buffers = (xk, x2t, scales.reshape(-1).contiguous(), vt, out)  # kept alive by the closure
            sizes = [ctypes.c_int64(k), ctypes.c_int64(mp), ctypes.c_int64(D), ctypes.c_int64(c)]
            return lambda: fn(*sizes, *[ctypes.c_void_p(t.data_ptr()) for t in buffers])

    elif method == "engine":

        def make(k: int):
            xk, vk = pick(k)
            return lambda: cpu.ENGINE.matmul(formula, xk, xk, {"scales": scales}, vk)

    elif method == "keops":

        def make(k: int):
            xk, vk = pick(k)

            def run():
                with settings.engine("keops"):
                    return backend.pairwise_matmul(formula, xk, xk, {"scales": scales}, vk)

            return run

    elif method == "keops-unpadded":

        def make(k: int):
            xk, vk = pick(k)

            def run():
                with keops_session():
                    K = formula(keops_lazy_tensor(xk[:, None, :]), keops_lazy_tensor(xk[None, :, :]),
                                scales=keops_lazy_tensor(scales[None]))
                    return K @ vk

            return run

    elif method in ("dense-engine", "dense-torch"):

        def make(k: int):
            xk, _ = pick(k)
            if method == "dense-engine":
                return lambda: cpu.ENGINE.dense(formula, xk, xk, {"scales": scales})

            def run():
                with torch.no_grad():
                    return backend.pairwise_dense(formula, xk, xk, {"scales": scales})

            return run

    elif method in ("grad-engine", "grad-keops"):
        s = scales.clone().requires_grad_()
        engine = cpu.ENGINE if method == "grad-engine" else backend

        def make(k: int):
            xk, vk = pick(k)
            xk = xk.clone().requires_grad_()
            wk = w[:k].contiguous()
            return lambda: engine.symmetric_gradients(formula, xk, xk, {"scales": s}, vk, wk)

    else:
        raise ValueError(method)
    return make


def child(spec: dict) -> dict:
    import torch

    from lazykern import native

    n, repeats = spec["n"], spec["repeats"]
    if spec["method"] == "paired":
        return paired(spec)
    make = _maker(spec["method"], spec["dtype"], spec["c"], n, spec["data"])
    compiled_before = len(native.compile_log)
    make(WARMUP_POINTS)()  # compiles, lazy imports
    record = _timed(make(n), repeats)
    record["engine_compiles_in_warmup"] = native.compile_log[compiled_before:]
    record["threads"] = torch.get_num_threads()
    return record


PAIRED = (("reference", 12), ("engine", 12), ("keops", 12), ("reference", 16), ("engine", 16), ("dense-engine", 12))


def paired(spec: dict) -> dict:
    """Reference, engine, KeOps and the dense build called in turn in ONE process, ``repeats``
    rounds: each round's ratios compare calls made seconds apart, so load from other jobs mostly
    cancels out. Before the rounds, the first full-size dense builds of the process (engine, then
    torch) are each timed between two lazy passes (engine, then KeOps as today)."""
    import torch

    runs = {}
    for method, c in PAIRED + (("dense-torch", 12),):
        make = _maker(method, spec["dtype"], c, spec["n"], spec["data"])
        make(WARMUP_POINTS)()
        runs[(method, c)] = make(spec["n"])

    def timed(key) -> tuple[float, float]:
        c0, w0 = time.process_time(), time.perf_counter()
        runs[key]()
        return time.perf_counter() - w0, time.process_time() - c0

    first = {}
    for dense, lazy in (("dense-engine", "engine"), ("dense-torch", "keops")):
        before, build, after = timed((lazy, 12)), timed((dense, 12)), timed((lazy, 12))
        first[f"{dense} first build / {lazy} lazy pass"] = build[0] / ((before[0] + after[0]) / 2)
    times: dict[tuple, list[tuple[float, float]]] = {key: [] for key in PAIRED}
    for _ in range(spec["repeats"]):
        for key in PAIRED:
            times[key].append(timed(key))
    ratios = {}
    for other, c in (("engine", 12), ("keops", 12), ("engine", 16)):
        ref, them = times[("reference", c)], times[(other, c)]
        ratios[f"{other}/reference C={c}"] = {
            "wall": statistics.median(r[0] / t[0] for r, t in zip(ref, them)),
            "cpu": statistics.median(r[1] / t[1] for r, t in zip(ref, them)),
        }
    lazy, dense = times[("engine", 12)], times[("dense-engine", 12)]
    ratios["dense-engine repeated build / engine lazy pass"] = {
        "wall": statistics.median(d[0] / e[0] for d, e in zip(dense, lazy)),
        "cpu": statistics.median(d[1] / e[1] for d, e in zip(dense, lazy)),
    }
    subnormal = (torch.tensor(1e-39, dtype=torch.float32) * 1.0).item() != 0.0
    return {
        "ratios": ratios,
        "first_build_ratios": first,
        "median_s": {f"{m} C={c}": statistics.median(t[0] for t in v) for (m, c), v in times.items()},
        "median_cpu_s": {f"{m} C={c}": statistics.median(t[1] for t in v) for (m, c), v in times.items()},
        "subnormals_survive_reference_load": subnormal,
        "load": os.getloadavg()[0],
    }


def compile_times(dtype: str) -> list[dict]:
    """Seconds to compile each engine pass of every stationary formula (d = 26), in an empty cache."""
    from lazykern.compiler.plan import program
    from lazykern import native
    from lazykern.cpu import reductions
    from lazykern.formulas import StationaryFormula
    from lazykern.formulas.stationary import MATERN_NUS

    cases = [("rbf", None), ("rq", None), ("periodic", None)] + [("matern", nu) for nu in MATERN_NUS]
    ctype = "float" if dtype == "float32" else "double"
    rows = []
    for family, nu in cases:
        for additive in (True, False):
            formula = StationaryFormula(family, additive, nu)
            pspec = tuple((name, 1 if name == "alpha" else D) for name in formula.param_names)
            names = ("x",) + tuple(formula.param_names)
            jobs = {"matmul": ("mm", ()), "dense": ("dense", ()), "backward x1 + params": ("gradA", names),
                    "backward x2 + rhs": ("gradB", ("x", "rhs")), "symmetric gradient": ("sym", names)}
            for label, (job, want) in jobs.items():
                red = program(formula, job, D, D, pspec, ctype, want)
                before = len(native.compile_log)
                reductions.load(red)
                name, seconds = native.compile_log[before]
                rows.append({"formula": f"{family}{'' if nu is None else nu}-{'additive' if additive else 'full'}",
                             "pass": label, "compile_s": round(seconds, 3)})
    return rows


# ---------------------------------------------------------------------------- the parent
def run_one(spec: dict, timeout: float, env: dict | None = None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **(env or {})))
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        return {**spec, "status": f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"}
    return {**spec, "status": "ok", **json.loads(line[7:])}


def _rate(r: dict) -> float:
    return r["n"] * r["n"] * D / r["median_s"]


def summarize(records: list[dict]) -> list[dict]:
    """Same-run ratios: throughput against the reference at the same column count, and the dense
    build (first in its process) against the engine's 12-column lazy pass."""
    ok = {(r["method"], r["dtype"], r["c"]): r for r in records if r.get("status") == "ok"}
    rows = []
    for dtype in DTYPES:
        pair = ok.get(("paired", dtype, 12))
        for what, q in (pair["ratios"].items() if pair else ()):
            if "C=" in what:
                c, what = int(what.split("C=")[1]), f"paired: {what.split(' ')[0]} (throughput)"
            else:
                c, what = 12, f"paired: {what} (time)"
            rows.append({"dtype": dtype, "c": c, "what": what, "wall": q["wall"], "cpu": q["cpu"]})
        for what, ratio in (pair["first_build_ratios"].items() if pair else ()):
            rows.append({"dtype": dtype, "c": 12, "what": f"paired: {what} (time)", "wall": ratio, "cpu": None})
        for c in sorted({r["c"] for r in records}):
            ref = ok.get(("reference", dtype, c))
            for method in ("keops", "keops-unpadded", "engine"):
                r = ok.get((method, dtype, c))
                if ref and r:
                    rows.append({"dtype": dtype, "c": c, "what": f"{method} / reference (throughput)",
                                 "wall": ref["median_s"] / r["median_s"], "cpu": ref["median_cpu_s"] / r["median_cpu_s"]})
        lazy = ok.get(("engine", dtype, 12))
        for method in ("dense-engine", "dense-torch"):
            r = ok.get((method, dtype, 12))
            if lazy and r:
                rows.append({"dtype": dtype, "c": 12, "what": f"{method} first build / engine lazy pass (time)",
                             "wall": r["first_s"] / lazy["median_s"], "cpu": None})
        keops = ok.get(("keops", dtype, 12))
        if keops and ok.get(("dense-torch", dtype, 12)):
            rows.append({"dtype": dtype, "c": 12, "what": "dense-torch first build / keops lazy pass (time, today)",
                         "wall": ok[("dense-torch", dtype, 12)]["first_s"] / keops["median_s"], "cpu": None})
        ge, gk = ok.get(("grad-engine", dtype, 12)), ok.get(("grad-keops", dtype, 12))
        if ge and gk:
            rows.append({"dtype": dtype, "c": 12, "what": "grad-keops / grad-engine (speed-up)",
                         "wall": gk["median_s"] / ge["median_s"], "cpu": gk["median_cpu_s"] / ge["median_cpu_s"]})
    return rows


def markdown(records: list[dict], ratios: list[dict], compiles: list[dict], meta: dict) -> str:
    m = meta["machine"]
    lines = [
        f"# Roofline: additive RBF, N = {meta['n']}, d = {D}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, load average at start {m['load_average_at_start'][0]:.1f} "
        f"(shared machine: compare ratios within this run). Data: {meta['data']}. Repeats: {meta['repeats']}. "
        f"{meta['note']}",
        "",
        "| method | dtype | C | median s | median CPU s | first s | pair.dim/s | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r.get("status") != "ok":
            lines.append(f"| {r['method']} | {r['dtype']} | {r['c']} | {r['status']} | | | | |")
            continue
        if r["method"] == "paired":
            for key, wall in r["median_s"].items():
                method, c = key.split(" C=")
                lines.append(f"| paired: {method} | {r['dtype']} | {c} | {wall:.3f} | {r['median_cpu_s'][key]:.3f} | | "
                             f"{r['n'] * r['n'] * D / wall:.3g} | {r['load']:.1f} |")
            continue
        lines.append(f"| {r['method']} | {r['dtype']} | {r['c']} | {r['median_s']:.3f} | {r['median_cpu_s']:.3f} | "
                     f"{r['first_s']:.3f} | {_rate(r):.3g} | {r['load']:.1f} |")
    lines += ["", "| ratio | dtype | C | wall | CPU |", "|---|---|---|---|---|"]
    for q in ratios:
        cpu = "" if q["cpu"] is None else f"{q['cpu']:.2f}"
        lines.append(f"| {q['what']} | {q['dtype']} | {q['c']} | {q['wall']:.2f} | {cpu} |")
    if compiles:
        lines += ["", "Engine compile seconds per pass (empty cache, d = 26, float32):", "",
                  "| formula | pass | compile s |", "|---|---|---|"]
        lines += [f"| {r['formula']} | {r['pass']} | {r['compile_s']:.2f} |" for r in compiles]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--compile-child", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--columns", type=int, nargs="+", default=[12, 16],
                        help="right-hand-side counts of the product methods (dense and gradient runs use 12)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile-times", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--data", choices=("auto", "pol", "random"), default="auto")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="roofline")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)

    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    if args.compile_child:
        print("RESULT " + json.dumps(compile_times(args.compile_child)), flush=True)
        return

    data = args.data if args.data != "auto" else ("pol" if _pol_path().exists() else "random")
    meta = {"machine": machine(), "n": args.n, "data": data, "repeats": args.repeats, "note": args.note}
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for dtype in args.dtypes:
        for method in args.methods:
            product = method in ("reference", "keops-unpadded", "engine")
            for c in (args.columns if product else [12]):
                repeats = 3 * args.repeats if method == "paired" else args.repeats
                spec = {"method": method, "dtype": dtype, "n": args.n, "c": c, "repeats": repeats, "data": data}
                r = run_one(spec, args.timeout)
                records.append(r)
                if r["status"] != "ok":
                    shown = r["status"]
                elif method == "paired":
                    shown = ", ".join(f"{k}: {q['wall']:.2f} wall, {q['cpu']:.2f} CPU" for k, q in r["ratios"].items())
                else:
                    shown = (f"{r['median_s']:.3f} s (CPU {r['median_cpu_s']:.3f} s, first {r['first_s']:.3f} s), "
                             f"{_rate(r):.3g} pair.dim/s, load {r['load']:.1f}")
                print(f"{dtype} {method:15s} C={c:2d} {shown}", flush=True)
    compiles = []
    if not args.no_compile_times:
        with tempfile.TemporaryDirectory(prefix="lazykern-compile-") as cache:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-child", "float32"]
            env = dict(os.environ, LAZYKERN_KEOPS_CACHE=cache, LAZYKERN_CPU_CACHE=cache)  # both engines compile cold
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
            compiles = json.loads(line[7:]) if line else []
            if not line:
                print("compile-time run failed:", proc.stderr[-2000:])
    ratios = summarize(records)
    for q in ratios:
        print(f"{q['dtype']} C={q['c']:2d} {q['what']}: wall {q['wall']:.2f}" + ("" if q["cpu"] is None else f", CPU {q['cpu']:.2f}"))
    if compiles:
        s = [r["compile_s"] for r in compiles]
        print(f"engine compiles: {len(s)} passes, median {statistics.median(s):.2f} s, max {max(s):.2f} s")
    payload = {"meta": meta, "records": records, "ratios": ratios, "compile_times": compiles}
    (args.out / f"{args.name}.json").write_text(json.dumps(payload, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(records, ratios, compiles, meta))
    print(f"wrote {args.out / args.name}.{{json,md}}")


if __name__ == "__main__":
    main()
