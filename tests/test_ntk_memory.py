"""Peak-memory claims of the empirical NTK, each measured in a fresh subprocess (VmHWM).

float32 MLP 64-256-256-10: its full NTK on N samples is an (N k) x (N k) matrix, 160 GB at
N = 20000; the operator must serve a diagonal and a product without anything near that.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (12 * 2**30, 12 * 2**30))
    import torch
    from torch import nn
    from lazykern.ntk import empirical_ntk

    def peak_bytes():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024

    n, backend, diag = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x = torch.randn(n, 64)
    v = torch.randn(n * 10, 1)
    K = empirical_ntk(net, x[:2], mode="full", backend=backend)  # imports and lazy inits off the books
    (K @ v[:20]).sum()
    before = peak_bytes()
    K = empirical_ntk(net, x, mode="full", backend=backend)
    d = K.diagonal() if diag else torch.ones(1)
    out = K @ v
    assert torch.isfinite(out).all() and torch.isfinite(d).all()
    print(json.dumps({"increase": peak_bytes() - before}))
    """
)


def _peak_increase(n: int, backend: str, diag: bool) -> int:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(n), backend, "1" if diag else "0"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])["increase"]


def test_auto_diagonal_and_product_at_20000_stay_under_1_5_gb() -> None:
    increase = _peak_increase(20_000, "auto", diag=True)
    assert increase < 1.5 * 2**30, f"peak RSS rose by {increase / 2**20:.0f} MiB"


@pytest.mark.slow
def test_keops_product_at_4000_stays_under_500_mb() -> None:
    increase = _peak_increase(4_000, "keops", diag=False)
    assert increase < 500 * 2**20, f"peak RSS rose by {increase / 2**20:.0f} MiB"
