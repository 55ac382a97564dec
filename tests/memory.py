"""Peak-RSS measurement of a code snippet in a fresh Python process (memory claims in tests)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_PRELUDE = """
import json, resource

def _vmhwm_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024

def _reset_peak():
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
"""


def peak_rss_increase_mb(setup: str, body: str, *, timeout: float = 900, memory_cap_gb: float = 8) -> float:
    """Run ``setup`` (imports, data), reset the peak, run ``body``; return peak RSS growth in MB.

    The child runs under an address-space cap so a regression fails the test instead of the machine.
    """
    script = "\n".join(
        [
            _PRELUDE,
            f"resource.setrlimit(resource.RLIMIT_AS, ({int(memory_cap_gb * 2**30)}, {int(memory_cap_gb * 2**30)}))",
            textwrap.dedent(setup),
            "_reset_peak()",
            "_baseline = _vmhwm_mb()",
            textwrap.dedent(body),
            "print('PEAK_JSON', json.dumps({'baseline': _baseline, 'peak': _vmhwm_mb()}))",
        ]
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"memory probe failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("PEAK_JSON"))
    result = json.loads(line.split(" ", 1)[1])
    return result["peak"] - result["baseline"]


#: The step the MLL memory tests time in their subprocess, after their setup defines ``model`` and
#: ``mll``: the lazy CG path (no dense matrix, no Cholesky), a few CG and Lanczos iterations.
MLL_STEP = r"""
def step(inputs, targets):
    with lazykern.settings.max_dense_bytes(0), \
            gpytorch.settings.max_cholesky_size(0), gpytorch.settings.max_cg_iterations(6), \
            gpytorch.settings.max_lanczos_quadrature_iterations(6), \
            gpytorch.settings.num_trace_samples(8):
        model.set_train_data(inputs, targets, strict=False)
        loss = -mll(model(inputs), targets)
        loss.backward()
    return loss
"""
