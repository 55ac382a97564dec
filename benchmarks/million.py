"""A million training points on a CPU, end to end: the large-N recipe on a synthetic additive problem.

:func:`lazykern.data.synthetic_additive` draws :math:`y = \\sum_{j=1}^{8} f_j(x_j) + \\varepsilon`
(no interaction term, noise standard deviation 0.1) at N = 10^6 training and 10^5 test points; the
first-order additive Matérn-5/2 kernel (``additive-matern52``) is trained by
:data:`lazykern.regression.LARGE_N` (an exact fit on 2,000 of the points, then Adam on all of them with
the grid preconditioner, the mean's weights solved in float64) and predicts the test points with
variances. In a fresh subprocess under an address-space limit (``--memory-gb``, 8 by default); its
wall time from start to exit and peak resident memory are recorded, with the test RMSE in original
units against the noise level the data were drawn with.

Usage::

    python benchmarks/million.py                    # N = 10^6, M = 10^5
    python benchmarks/million.py --n 100000         # a smaller check

Writes ``benchmarks/results/million.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NOISE = 0.1

CHILD = r"""
import json, sys, time
import torch
from lazykern.data import synthetic_additive
from lazykern.regression import LARGE_N, fit_evaluate

spec = json.loads(sys.argv[1])
start = time.perf_counter()
data = synthetic_additive(spec["n"], spec["m"], 8, noise=spec["noise"], interaction=0.0, seed=0)
loaded = time.perf_counter() - start
recipe = LARGE_N if spec["iters"] is None else LARGE_N.__class__(**{**LARGE_N.__dict__, "iters": spec["iters"]})
result = fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel="additive-matern52",
                      recipe=recipe, y_scale=data.y_std, analyze=False, progress=False)
record = {k: v for k, v in result.to_dict().items() if k != "hyperparameters"}
print("RESULT " + json.dumps({**record, "load_seconds": loaded, "y_std": data.y_std}))
"""

#: Runs the child and reports its peak resident memory (a wrapper process of its own, whose
#: ``RUSAGE_CHILDREN`` is that one child's).
PEAK = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(p.returncode)")


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--m", type=int, default=100_000)
    parser.add_argument("--iters", type=int, default=None, help="Adam steps on all points (default: LARGE_N's)")
    parser.add_argument("--memory-gb", type=float, default=8.0)
    args = parser.parse_args()
    spec = {"n": args.n, "m": args.m, "noise": NOISE, "iters": args.iters}
    cap = int(args.memory_gb * 2**30)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-W", "ignore", "-c", CHILD, json.dumps(spec)],
                          capture_output=True, text=True, env=env,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"the run failed after {wall:.0f} s:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    peak = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK_RSS_KB ")) / 1024
    record = {"spec": spec, "wall_seconds": wall, "peak_rss_mb": peak, "result": result,
              "machine": f"{_cpu()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "torch": __import__("torch").__version__, "command": " ".join(["python", *sys.argv])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "million.json").write_text(json.dumps(record, indent=1) + "\n")
    (RESULTS / "million.md").write_text(markdown(record))
    print(markdown(record))


def markdown(record: dict) -> str:
    r, spec = record["result"], record["spec"]
    ratio = r["rmse_original"] / spec["noise"]
    return "\n".join([
        f"# A million training points on a CPU ({record['date']})", "",
        f"`{record['command']}` on {record['machine']}, torch {record['torch']}: `synthetic_additive` with d = 8, no "
        f"interaction, noise standard deviation {spec['noise']}; `additive-matern52` by `LARGE_N`.", "",
        "| N | test points | wall time | training | prediction and variances | peak RSS | test RMSE (original units) "
        "| RMSE / noise | test NLPD | solver |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {r['n_train']:,} | {r['n_test']:,} | {record['wall_seconds']:.0f} s | {r['train_seconds']:.0f} s "
        f"| {r['predict_seconds']:.0f} s | {record['peak_rss_mb']:.0f} MB | {r['rmse_original']:.4f} | {ratio:.3f} "
        f"| {r['nlpd_original']:.3f} | {r['solver']}, {r['iterations']} Adam steps |", "",
        "Interventions: " + ("; ".join(r["interventions"]) or "none") + ".", "",
    ])


if __name__ == "__main__":
    main()
