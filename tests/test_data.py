"""UCI loader: layout, splits, standardization, subsampling, and the verified download cache."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from lazykern.data import DATASETS, DownloadError, fetch_uci, load_uci, locate_uci, synthetic_additive
from lazykern.data.checksums import SHA256


def read_raw(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(folder / "data.csv.gz", "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    with gzip.open(folder / "test_mask.csv.gz", "rt") as f:
        mask = np.loadtxt(f, delimiter=",") != 0
    return data, mask


@pytest.fixture(scope="module")
def pol_raw(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    return read_raw(data_dir / "pol")


def original_x(data, x: torch.Tensor) -> np.ndarray:
    return (x * data.x_std + data.x_mean).numpy()


def test_shapes_and_split_match_the_mask(data_dir, pol_raw):
    raw, mask = pol_raw
    assert raw.shape == (15000, 27) and mask.shape == (15000, 10)
    data = load_uci("pol", split=3, data_dir=data_dir)
    test = mask[:, 3]
    assert data.train_x.shape == (int((~test).sum()), 26) and data.train_y.shape == (data.n_train,)
    assert data.test_x.shape == (int(test.sum()), 26) and data.test_y.shape == (data.n_test,)
    assert data.n_train + data.n_test == 15000 and data.d == 26
    # Train and test are the complementary row sets of the mask column, in file order.
    np.testing.assert_allclose(original_x(data, data.train_x), raw[~test, :-1], atol=1e-9)
    np.testing.assert_allclose(original_x(data, data.test_x), raw[test, :-1], atol=1e-9)
    np.testing.assert_allclose(data.y_to_original(data.test_y).numpy(), raw[test, -1], atol=1e-9)
    other = load_uci("pol", split=4, data_dir=data_dir)
    assert not torch.equal(other.test_y, data.test_y)


def test_standardized_with_training_statistics(data_dir, pol_raw):
    raw, mask = pol_raw
    data = load_uci("pol", split=0, data_dir=data_dir)
    train = raw[~mask[:, 0]]
    std = train.std(0)
    std[std == 0] = 1.0
    np.testing.assert_allclose(data.x_mean.numpy(), train[:, :-1].mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(data.x_std.numpy(), std[:-1], rtol=1e-12)
    assert data.y_mean == pytest.approx(train[:, -1].mean()) and data.y_std == pytest.approx(train[:, -1].std())
    np.testing.assert_allclose(data.train_x.mean(0).numpy(), 0.0, atol=1e-10)
    varying = train[:, :-1].std(0) > 0
    np.testing.assert_allclose(data.train_x.std(0, unbiased=False).numpy()[varying], 1.0, rtol=1e-10)
    assert float(data.train_y.mean()) == pytest.approx(0.0, abs=1e-10)
    assert float(data.train_y.std(unbiased=False)) == pytest.approx(1.0, rel=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_and_device(data_dir, dtype):
    data = load_uci("pol", n_train=100, dtype=dtype, device="cpu", data_dir=data_dir)
    for t in (data.train_x, data.train_y, data.test_x, data.test_y, data.x_mean, data.x_std):
        assert t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()


def test_subsampling_is_deterministic_and_a_subset(data_dir, pol_raw):
    raw, mask = pol_raw
    a = load_uci("pol", n_train=500, seed=7, data_dir=data_dir)
    b = load_uci("pol", n_train=500, seed=7, data_dir=data_dir)
    c = load_uci("pol", n_train=500, seed=8, data_dir=data_dir)
    assert a.n_train == 500 and a.n_test == int(mask[:, 0].sum())
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.train_y, b.train_y)
    assert not torch.equal(a.train_x, c.train_x)
    # Statistics come from the subset: it is standardized exactly.
    assert float(a.train_y.mean()) == pytest.approx(0.0, abs=1e-10)
    distances = cdist(original_x(a, a.train_x), raw[~mask[:, 0], :-1])
    assert distances.min(axis=1).max() < 1e-8, "every subsampled point is a training point of the split"


def test_environment_variable_locates_data(data_dir, monkeypatch):
    monkeypatch.setenv("LAZYKERN_DATA", str(data_dir))
    assert locate_uci("pol") == data_dir / "pol"
    assert load_uci("pol", n_train=10).n_train == 10


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"name": "nosuchdata"}, ValueError, "unknown UCI dataset 'nosuchdata'"),
        ({"name": "pol", "split": 10}, ValueError, r"split must be an int in 0\.\.9"),
        ({"name": "pol", "split": -1}, ValueError, "split"),
        ({"name": "pol", "n_train": 0}, ValueError, "n_train must be a positive int"),
        ({"name": "pol", "n_train": 13501}, ValueError, "exceeds the 13500 training points"),
        ({"name": "pol", "dtype": torch.int64}, TypeError, "dtype must be"),
        ({"name": "pol", "device": "nodevice"}, ValueError, "device must be"),
        ({"name": 3}, TypeError, "name must be a str"),
    ],
)
def test_bad_arguments(data_dir, kwargs, error, match):
    name = kwargs.pop("name")
    with pytest.raises(error, match=match):
        load_uci(name, data_dir=data_dir, **kwargs)


def test_missing_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_uci("pol", data_dir=tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="lacks data.csv.gz or test_mask.csv.gz"):
        load_uci("pol", data_dir=tmp_path)


def test_a_custom_folder_in_the_layout_loads(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    rows = np.arange(40.0).reshape(20, 2)
    mask = np.zeros((20, 10), dtype=int)
    mask[:5, 0] = 1
    np.savetxt(folder / "data.csv.gz", rows, delimiter=",")
    np.savetxt(folder / "test_mask.csv.gz", mask, delimiter=",", fmt="%d")
    data = load_uci("mine", data_dir=tmp_path)
    assert (data.n_train, data.n_test, data.d) == (15, 5, 1)
    np.testing.assert_allclose(data.y_to_original(data.test_y).numpy(), rows[:5, 1])


def test_checksums_match_the_shared_copy(data_dir):
    folders = sorted(p.name for p in data_dir.iterdir() if (p / "data.csv.gz").exists())
    assert set(folders) <= set(DATASETS)
    for name in folders:
        for file, expected in zip(("data.csv.gz", "test_mask.csv.gz"), SHA256[name]):
            assert hashlib.sha256((data_dir / name / file).read_bytes()).hexdigest() == expected, (name, file)


def test_synthetic_additive_is_standardized_and_seeded():
    a = synthetic_additive(300, 50, 4, seed=1)
    b = synthetic_additive(300, 50, 4, seed=1)
    assert torch.equal(a.train_x, b.train_x) and a.test_x.shape == (50, 4)
    assert float(a.train_y.mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(a.train_y.std(unbiased=False)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="d must be a positive int"):
        synthetic_additive(10, 10, 0)


# ---------------------------------------------------------------- download path


class _Server:
    """A static file server on 127.0.0.1 that counts requests."""

    def __init__(self, root: Path) -> None:
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
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/uci"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def mirror(data_dir, tmp_path):
    """A copy of the yacht files served over HTTP, and the served folder (to corrupt it)."""
    served = tmp_path / "www" / "uci" / "yacht"
    shutil.copytree(data_dir / "yacht", served)
    server = _Server(tmp_path / "www")
    yield server, served
    server.close()


def test_download_verifies_and_caches(mirror, data_dir, tmp_path, monkeypatch):
    server, _ = mirror
    cache = tmp_path / "cache"
    folder = fetch_uci("yacht", cache_dir=cache, base_url=server.url)
    assert folder == cache / "yacht"
    assert sorted(server.requests) == ["/uci/yacht/data.csv.gz", "/uci/yacht/test_mask.csv.gz"]
    for file in ("data.csv.gz", "test_mask.csv.gz"):
        assert (folder / file).read_bytes() == (data_dir / "yacht" / file).read_bytes()
    assert not list(folder.glob("*.part"))

    fetch_uci("yacht", cache_dir=cache, base_url=server.url)
    assert len(server.requests) == 2, "a verified cache must not be downloaded again"

    # A cached file damaged on disk is detected and fetched again.
    (folder / "test_mask.csv.gz").write_bytes(b"damaged")
    fetch_uci("yacht", cache_dir=cache, base_url=server.url)
    assert server.requests[2:] == ["/uci/yacht/test_mask.csv.gz"]

    # load_uci falls back to the cache (XDG_CACHE_HOME) and the mirror (LAZYKERN_UCI_URL).
    monkeypatch.delenv("LAZYKERN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("LAZYKERN_UCI_URL", server.url)
    data = load_uci("yacht", split=2)
    assert (tmp_path / "xdg" / "lazykern" / "uci" / "yacht" / "data.csv.gz").is_file()
    assert data.n_train + data.n_test == 308 and data.d == 6


def test_corrupted_download_is_rejected_and_not_cached(mirror, tmp_path):
    server, served = mirror
    payload = bytearray((served / "data.csv.gz").read_bytes())
    payload[len(payload) // 2] ^= 0xFF
    (served / "data.csv.gz").write_bytes(bytes(payload))
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError, match="SHA-256 .* expected; the file was rejected and not cached"):
        fetch_uci("yacht", cache_dir=cache, base_url=server.url)
    assert not (cache / "yacht" / "data.csv.gz").exists()
    assert not list((cache / "yacht").glob("*.part"))


def test_offline_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadError, match="could not download .*set LAZYKERN_DATA"):
        fetch_uci("yacht", cache_dir=tmp_path, base_url=f"http://127.0.0.1:{port}")
    assert not (tmp_path / "yacht" / "data.csv.gz").exists()


def test_download_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="unknown UCI dataset"):
        fetch_uci("nosuchdata", cache_dir=tmp_path)
