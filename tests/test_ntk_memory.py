"""Peak-memory claims of the empirical NTK, each measured in a fresh subprocess (VmHWM).

* float32 MLP 64-256-256-10: its full NTK on N samples is an (N k) x (N k) matrix, 160 GB at
  N = 20000; the operator must serve a diagonal and a product without anything near that.
* An embedding's features never hold a vocabulary-sized vector: the trace NTK of a token model
  (blocks, product, diagonal) on the feature backend takes no more memory at vocabulary 50,000 than
  at 500. The backend is pinned: ``"auto"`` chooses by measured throughput, and the linearized
  backend it may choose holds parameter-sized (so vocabulary-sized) vectors by design.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.memory import peak_rss_increase_mb

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


@pytest.mark.slow
def test_auto_diagonal_and_product_at_20000_stay_under_1_5_gb() -> None:
    increase = _peak_increase(20_000, "auto", diag=True)
    assert increase < 1.5 * 2**30, f"peak RSS rose by {increase / 2**20:.0f} MiB"


@pytest.mark.slow
def test_keops_product_at_4000_stays_under_500_mb() -> None:
    increase = _peak_increase(4_000, "keops", diag=False)
    assert increase < 500 * 2**20, f"peak RSS rose by {increase / 2**20:.0f} MiB"


EMBEDDING_SETUP = """
import sys, torch
from torch import nn
from lazykern.ntk import empirical_ntk
vocab = {vocab}
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(vocab, 32), nn.Flatten(), nn.Linear(16 * 32, 4)).double()
ids = torch.randint(0, vocab, (800, 16))
v = torch.randn(800, 2, dtype=torch.float64)
small = empirical_ntk(model, ids[:8], mode="trace", backend="dense")
small.to_dense(), small @ v[:8], small.diagonal()  # imports and lazy inits off the books
"""

EMBEDDING_BODY = """
K = empirical_ntk(model, ids, mode="trace", backend="dense")
assert torch.isfinite(K.to_dense()).all() and torch.isfinite(K @ v).all() and torch.isfinite(K.diagonal()).all()
"""


def test_embedding_memory_does_not_grow_with_the_vocabulary() -> None:
    small = peak_rss_increase_mb(EMBEDDING_SETUP.format(vocab=500), EMBEDDING_BODY)
    large = peak_rss_increase_mb(EMBEDDING_SETUP.format(vocab=50_000), EMBEDDING_BODY)
    assert large <= 1.1 * small, f"vocabulary 50,000: +{large:.0f} MB, vocabulary 500: +{small:.0f} MB"
