"""Empirical NTK: lazykern against torch.func, nngeometry and neural-tangents, side by side.

Each measurement runs in its own subprocess under an ``RLIMIT_AS`` cap and reports the median
wall time of its repeats and its peak-RSS increase (VmHWM) over the process after imports and
setup. The network is the MLP 784-512-512-10 (ReLU, biases), float32, inputs ``randn``; the
quantity is the full (N, N, k, k) kernel, or a full-mode product for the large-N rows.

Peers are optional and never lazykern dependencies:

* nngeometry: ``NNGEOMETRY_PYTHON`` (default: a ``/work/venvs/ngeo`` venv made with
  ``--system-site-packages`` and ``pip install --no-deps nngeometry==0.4 einops unfoldNd``);
* neural-tangents: ``NT_PYTHON`` (default ``/work/venvs/nt``, built from
  ``/work/shared/bench-envs/neural-tangents.txt``); stax ``Dense`` with biases, structured
  derivatives (``implementation=3``); jit compilation is timed separately.

Run: ``python benchmarks/ntk.py`` (a few minutes on 2 cores); writes ``benchmarks/results/ntk.json``
and ``benchmarks/results/ntk.md``.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WIDTHS = (784, 512, 512, 10)
AS_CAP = 20 * 2**30
NNGEOMETRY_PYTHON = os.environ.get("NNGEOMETRY_PYTHON", "/work/venvs/ngeo/bin/python")
NT_PYTHON = os.environ.get("NT_PYTHON", "/work/venvs/nt/bin/python")

COMMON = textwrap.dedent(
    """
    import json, statistics, sys, time
    WIDTHS = {widths}
    N, REPEATS = {n}, {repeats}

    def peak():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

    def measure(fn, warmup=True):
        first = None
        if warmup:
            t = time.perf_counter(); fn(); first = time.perf_counter() - t
        times = []
        for _ in range(REPEATS):
            t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
        return {{"median_s": statistics.median(times), "times_s": times, "first_s": first}}
    """
)

TORCH_SETUP = textwrap.dedent(
    """
    import torch
    from torch import nn
    torch.manual_seed(0)
    layers = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    net = nn.Sequential(*layers[:-1])
    x = torch.randn(N, WIDTHS[0])
    """
)

def _lazykern_matvec_worker(backend: str) -> str:
    return TORCH_SETUP + textwrap.dedent(
        f"""
        from lazykern.ntk import empirical_ntk
        v = torch.randn(N * WIDTHS[-1], 1)
        empirical_ntk(net, x[:4], backend="{backend}") @ v[:4 * WIDTHS[-1]]
        base = peak()
        r = measure(lambda: empirical_ntk(net, x, mode="full", backend="{backend}") @ v)
        """
    )


WORKERS = {
    "lazykern_dense_matrix": TORCH_SETUP
    + textwrap.dedent(
        """
        from lazykern.ntk import empirical_ntk
        empirical_ntk(net, x[:4]).to_dense()
        base = peak()
        r = measure(lambda: empirical_ntk(net, x, mode="full", backend="dense").to_dense())
        """
    ),
    **{f"lazykern_matvec_{backend}": _lazykern_matvec_worker(backend) for backend in ("dense", "linearized")},
    "torch_func_jacobian_contraction": TORCH_SETUP
    + textwrap.dedent(
        """
        from torch.func import functional_call, jacrev, vmap
        params = {k: p.detach() for k, p in net.named_parameters()}
        def f(p, xi):
            return functional_call(net, p, (xi[None],))[0]
        def ntk():
            j = vmap(jacrev(f), (None, 0))(params, x)
            return sum(torch.einsum("iop,jqp->ijoq", a.flatten(2), a.flatten(2)) for a in j.values())
        base = peak()
        r = measure(ntk, warmup=False)
        """
    ),
    "nngeometry_gram": TORCH_SETUP
    + textwrap.dedent(
        """
        from nngeometry.backend import TorchHooksJacobianBackend
        def gram():
            return TorchHooksJacobianBackend(net).get_gram_matrix((x,))
        base = peak()
        r = measure(gram)
        """
    ),
    "neural_tangents_structured": textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        import neural_tangents as nt
        from neural_tangents import stax
        layers = []
        for b in WIDTHS[1:]:
            layers += [stax.Dense(b, b_std=1.0), stax.Relu()]
        init_fn, apply_fn, _ = stax.serial(*layers[:-1])
        _, params = init_fn(jax.random.PRNGKey(0), (-1, WIDTHS[0]))
        x = jax.random.normal(jax.random.PRNGKey(1), (N, WIDTHS[0]))
        fn = jax.jit(nt.empirical_ntk_fn(apply_fn, trace_axes=(), implementation=3))
        base = peak()
        t = time.perf_counter(); fn(x, None, params).block_until_ready(); compile_s = time.perf_counter() - t
        r = measure(lambda: fn(x, None, params).block_until_ready(), warmup=False)
        r["first_s"] = compile_s
        """
    ),
}

TAIL = 'r["peak_increase_mb"] = (peak() - base) / 2**20\nprint("RESULT " + json.dumps(r))\n'

# (method, N, repeats, python): full kernel at N=256 (torch.func at N=64: ~30 s at N=128 on 2 cores),
# products at N=4096 where the kernel itself would take 6.7 GB.
PLAN = [
    ("lazykern_dense_matrix", 64, 3, sys.executable),
    ("torch_func_jacobian_contraction", 64, 1, sys.executable),
    ("lazykern_dense_matrix", 256, 3, sys.executable),
    ("nngeometry_gram", 256, 3, NNGEOMETRY_PYTHON),
    ("neural_tangents_structured", 256, 3, NT_PYTHON),
    ("lazykern_matvec_dense", 4096, 3, sys.executable),
    ("lazykern_matvec_linearized", 4096, 3, sys.executable),
]


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP))


def run(method: str, n: int, repeats: int, python: str) -> dict:
    row = {"method": method, "N": n, "k": WIDTHS[-1], "widths": list(WIDTHS)}
    if not Path(python).exists():
        return {**row, "status": f"skipped: {python} not found"}
    code = COMMON.format(widths=WIDTHS, n=n, repeats=repeats) + WORKERS[method] + TAIL
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=900, preexec_fn=_cap, env=env)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout (900 s)"}
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        return {**row, "status": f"failed: {out.stderr.strip().splitlines()[-1:]}"}
    return {**row, "status": "ok", **json.loads(lines[-1][len("RESULT ") :])}


def markdown(rows: list[dict]) -> str:
    lines = [
        f"MLP {'-'.join(map(str, WIDTHS))}, float32, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores. Median wall time; peak RSS increase over the process after setup.",
        "",
        "| method | N | quantity | median time (s) | first call (s) | peak RSS increase (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        quantity = "full-mode product" if "matvec" in r["method"] else "full kernel (N,N,k,k)"
        if r["status"] != "ok":
            lines.append(f"| {r['method']} | {r['N']} | {quantity} | {r['status']} | | |")
            continue
        first = "" if r.get("first_s") is None else f"{r['first_s']:.2f}"
        lines.append(
            f"| {r['method']} | {r['N']} | {quantity} | {r['median_s']:.3f} | {first} | {r['peak_increase_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = []
    for method, n, repeats, python in PLAN:
        row = run(method, n, repeats, python)
        print(json.dumps(row), flush=True)
        rows.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ntk.json").write_text(json.dumps(rows, indent=2) + "\n")
    (RESULTS / "ntk.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
