"""Shared fixtures.

Data. Tests of the loader, the command and the examples run on ``uci_fixture``: a small folder in
the uci_datasets layout, written once per test run into a temporary folder, with its checksums
computed there; they run anywhere. Only tests of the real copy (``LAZYKERN_DATA`` if set, else
``../shared/uci`` beside the checkout) may skip: they take the ``data_dir`` fixture, which marks them
``real_data`` and, where the copy is absent, skips them all with one reason (one line of ``-ra``).
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import gpytorch
import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

REAL_DATA_REASON = (
    "needs the real UCI copy (uci_datasets layout): set LAZYKERN_DATA to it or put it at ../shared/uci"
)

# name: (rows, input dimensions). pol keeps its real width (26), so the command's formulas are the
# ones the real data compiles; a few hundred rows keep every run on the torch engine and quick.
FIXTURE_SHAPES = {"pol": (400, 26), "yacht": (120, 6)}
FILES = ("data.csv.gz", "test_mask.csv.gz")


def uci_data_dir() -> Path:
    return Path(os.environ.get("LAZYKERN_DATA", ROOT.parent / "shared" / "uci"))


#: Most xdist workers: each may hold a memory test's process (up to ~1.5 GB) at once.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_data: runs on the real UCI copy; skipped, with one reason, without it")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        # The workers share the cores: more torch threads than cores would only contend.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "data_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_data)
    items[:] = _slow_first_in_every_share(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def _slow_first_in_every_share(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """The order in which xdist's work stealing gives every worker the slow tests first.

    It hands each worker one contiguous share of the list (``len // workers`` of what is left) and
    later moves tests from the end of a busy worker's queue to an idle one: with each share
    starting on its part of the slow tests, the workers run those side by side and end on short
    tests, instead of one worker running a minute-long compile alone at the end."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    fast = iter([item for item in items if not item.get_closest_marker("slow")])
    ordered: list[pytest.Item] = []
    for k in range(workers):
        size = (len(items) - len(ordered)) // (workers - k)
        share = slow[k::workers]
        ordered += share + [next(fast) for _ in range(max(0, size - len(share)))]
    return ordered + list(fast)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Skipped here rather than in the fixture: pytest reports a fixture's skip at each test's own
    # line, this hook's at this one line, so -ra folds every real-data skip into one summary line.
    if item.get_closest_marker("real_data") and not (uci_data_dir() / "pol" / "data.csv.gz").exists():
        pytest.skip(REAL_DATA_REASON)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real uci_datasets copy; tests that take it are marked ``real_data`` (and skipped without it)."""
    return uci_data_dir()


def read_raw(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """A dataset folder's rows and boolean test mask, read independently of lazykern's loader."""
    with gzip.open(folder / "data.csv.gz", "rt") as f:
        data = np.loadtxt(f, delimiter=",", ndmin=2)
    with gzip.open(folder / "test_mask.csv.gz", "rt") as f:
        mask = np.loadtxt(f, delimiter=",", ndmin=2) != 0
    return data, mask


@dataclass(frozen=True)
class UCIFixture:
    """A uci_datasets-layout folder made by :func:`write_uci_fixture` and the SHA-256 of its files."""

    root: Path
    sha256: dict[str, tuple[str, str]]

    def raw(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return read_raw(self.root / name)


def write_uci_fixture(root: Path, shapes: dict[str, tuple[int, int]] = FIXTURE_SHAPES, seed: int = 0) -> UCIFixture:
    """Write one folder per dataset in the uci_datasets layout under ``root``.

    Inputs have their own offsets and scales (so standardization matters), one constant input
    column (as real datasets have), and a smooth target plus noise (so a GP beats the mean
    predictor); the test mask assigns every row to exactly one of the 10 splits, as the real masks do.
    """
    rng = np.random.default_rng(seed)
    digests = {}
    for name, (n, d) in shapes.items():
        folder = root / name
        folder.mkdir(parents=True)
        x = rng.uniform(-1.0, 1.0, size=(n, d))
        y = np.sin(3.0 * x[:, 0]) + x[:, 1 % d] ** 2 + 0.5 * x[:, 2 % d] + 0.05 * rng.standard_normal(n)
        x = x * rng.uniform(0.5, 20.0, size=d) + rng.uniform(-50.0, 50.0, size=d)
        x[:, d // 2] = 7.0
        mask = np.zeros((n, 10), dtype=int)
        mask[np.arange(n), rng.permutation(n) % 10] = 1
        np.savetxt(folder / "data.csv.gz", np.column_stack([x, 100.0 + 30.0 * y]), delimiter=",", fmt="%.10g")
        np.savetxt(folder / "test_mask.csv.gz", mask, delimiter=",", fmt="%d")
        digests[name] = tuple(hashlib.sha256((folder / file).read_bytes()).hexdigest() for file in FILES)
    return UCIFixture(root, digests)


@pytest.fixture(scope="session")
def uci_fixture(tmp_path_factory: pytest.TempPathFactory) -> UCIFixture:
    """Small datasets named ``pol`` and ``yacht`` in the uci_datasets layout (see :func:`write_uci_fixture`)."""
    return write_uci_fixture(tmp_path_factory.mktemp("uci"))


class FileServer:
    """A static file server on 127.0.0.1 that records the paths requested; ``url`` ends in ``prefix``."""

    def __init__(self, root: Path, prefix: str = "") -> None:
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{prefix}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def uci_mirror(uci_fixture: UCIFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FileServer, Path]]:
    """A local HTTP mirror of the fixture's yacht, whose checksums lazykern is told to expect; yields
    the server (its ``url`` is a ``base_url``) and the served folder (to corrupt it)."""
    from lazykern.data.checksums import SHA256

    served = tmp_path / "www" / "uci" / "yacht"
    served.mkdir(parents=True)
    for file in FILES:
        (served / file).write_bytes((uci_fixture.root / "yacht" / file).read_bytes())
    monkeypatch.setitem(SHA256, "yacht", uci_fixture.sha256["yacht"])
    server = FileServer(tmp_path / "www", prefix="/uci")
    yield server, served
    server.close()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _gpytorch_kernels_stay_lazy() -> Iterator[None]:
    """GPyTorch's settings are process-wide; a test that leaves lazily_evaluate_kernels off (e.g.
    by entering it from several threads at once) changes what kernel(x) returns in every later test
    of its worker. Fail the leaking test instead of a later, unrelated one."""
    flag = gpytorch.settings.lazily_evaluate_kernels
    before = flag._state
    yield
    left, flag._state = flag._state, before
    assert left == before, f"this test left gpytorch's lazily_evaluate_kernels at {left!r} (restored to {before!r})"
