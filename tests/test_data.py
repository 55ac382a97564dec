"""UCI loader: layout, splits, standardization, subsampling, and the verified download cache.

Everything runs on the suite's small uci_datasets-layout fixture and a local HTTP mirror; the
tests that take ``data_dir`` check the real copy (and skip without it).
"""

from __future__ import annotations

import hashlib
import socket

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from lazykern.data import DATASETS, DownloadError, fetch_uci, load_uci, locate_uci, synthetic_additive
from lazykern.data.checksums import SHA256

from .conftest import FILES, read_raw, write_uci_fixture


def original_x(data, x: torch.Tensor) -> np.ndarray:
    return (x * data.x_std + data.x_mean).numpy()


def test_shapes_and_split_match_the_mask(uci_fixture):
    raw, mask = uci_fixture.raw("pol")
    n, width = raw.shape
    data = load_uci("pol", split=3, data_dir=uci_fixture.root)
    test = mask[:, 3]
    assert data.train_x.shape == (int((~test).sum()), width - 1) and data.train_y.shape == (data.n_train,)
    assert data.test_x.shape == (int(test.sum()), width - 1) and data.test_y.shape == (data.n_test,)
    assert data.n_train + data.n_test == n and data.d == width - 1
    # Train and test are the complementary row sets of the mask column, in file order.
    np.testing.assert_allclose(original_x(data, data.train_x), raw[~test, :-1], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(original_x(data, data.test_x), raw[test, :-1], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(data.y_to_original(data.test_y).numpy(), raw[test, -1], rtol=1e-12)
    other = load_uci("pol", split=4, data_dir=uci_fixture.root)
    assert not torch.equal(other.test_y, data.test_y)


def test_standardized_with_training_statistics(uci_fixture):
    raw, mask = uci_fixture.raw("pol")
    data = load_uci("pol", split=0, data_dir=uci_fixture.root)
    train = raw[~mask[:, 0]]
    std = train.std(0)
    assert (std == 0).sum() == 1, "the fixture has one constant input column"
    std[std == 0] = 1.0
    np.testing.assert_allclose(data.x_mean.numpy(), train[:, :-1].mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(data.x_std.numpy(), std[:-1], rtol=1e-12)
    assert data.y_mean == pytest.approx(train[:, -1].mean()) and data.y_std == pytest.approx(train[:, -1].std())
    np.testing.assert_allclose(data.train_x.mean(0).numpy(), 0.0, atol=1e-10)
    varying = train[:, :-1].std(0) > 0
    np.testing.assert_allclose(data.train_x.std(0, unbiased=False).numpy()[varying], 1.0, rtol=1e-10)
    np.testing.assert_array_equal(data.train_x.numpy()[:, ~varying], 0.0)
    assert float(data.train_y.mean()) == pytest.approx(0.0, abs=1e-10)
    assert float(data.train_y.std(unbiased=False)) == pytest.approx(1.0, rel=1e-10)


def test_an_input_constant_in_training_is_divided_by_one_not_by_its_rounding(tmp_path):
    # elevators' columns 14 and 16: -1.8073e-08 in all but 3 of 16,599 rows. The float64 std of the
    # constant training values is 3e-24 (the mean's rounding), and dividing by it made a test value
    # 1e-4 away a standardized 1e20, where OAK's predictive variance overflowed to inf.
    write_uci_fixture(tmp_path, {"yacht": (200, 6)})
    raw, mask = read_raw(tmp_path / "yacht")
    raw[:, 1] = -1.8073e-08
    first_test = int(np.flatnonzero(mask[:, 0])[0])
    raw[first_test, 1] = 9.9982e-05
    np.savetxt(tmp_path / "yacht" / "data.csv.gz", raw, delimiter=",", fmt="%.10g")
    data = load_uci("yacht", split=0, data_dir=tmp_path, dtype=torch.float64)
    assert data.x_std[1] == 1.0 and data.x_mean[1] == pytest.approx(-1.8073e-08, rel=1e-12)
    assert data.train_x[:, 1].abs().max() < 1e-20 and data.test_x[0, 1] == pytest.approx(1e-4, rel=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_and_device(uci_fixture, dtype):
    data = load_uci("pol", n_train=100, dtype=dtype, device="cpu", data_dir=uci_fixture.root)
    for t in (data.train_x, data.train_y, data.test_x, data.test_y, data.x_mean, data.x_std):
        assert t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()


def test_subsampling_is_deterministic_and_a_subset(uci_fixture):
    raw, mask = uci_fixture.raw("pol")
    root = uci_fixture.root
    a = load_uci("pol", n_train=150, seed=7, data_dir=root)
    b = load_uci("pol", n_train=150, seed=7, data_dir=root)
    c = load_uci("pol", n_train=150, seed=8, data_dir=root)
    assert a.n_train == 150 and a.n_test == int(mask[:, 0].sum())
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.train_y, b.train_y)
    assert not torch.equal(a.train_x, c.train_x)
    # Statistics come from the subset: it is standardized exactly.
    assert float(a.train_y.mean()) == pytest.approx(0.0, abs=1e-10)
    distances = cdist(original_x(a, a.train_x), raw[~mask[:, 0], :-1])
    assert distances.min(axis=1).max() < 1e-8, "every subsampled point is a training point of the split"


def test_environment_variable_locates_data(uci_fixture, monkeypatch):
    monkeypatch.setenv("LAZYKERN_DATA", str(uci_fixture.root))
    assert locate_uci("pol") == uci_fixture.root / "pol"
    assert load_uci("pol", n_train=10).n_train == 10


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"name": "nosuchdata"}, ValueError, "unknown UCI dataset 'nosuchdata'"),
        ({"name": "pol", "split": 10}, ValueError, r"split must be an int in 0\.\.9"),
        ({"name": "pol", "split": -1}, ValueError, "split"),
        ({"name": "pol", "n_train": 0}, ValueError, "n_train must be a positive int"),
        ({"name": "pol", "n_train": 361}, ValueError, "n_train=361 exceeds the 360 training points of pol split 0"),
        ({"name": "pol", "dtype": torch.int64}, TypeError, "dtype must be"),
        ({"name": "pol", "device": "nodevice"}, ValueError, "device must be"),
        ({"name": 3}, TypeError, "name must be a str"),
    ],
)
def test_bad_arguments(uci_fixture, kwargs, error, match):
    name = kwargs.pop("name")
    with pytest.raises(error, match=match):
        load_uci(name, data_dir=uci_fixture.root, **kwargs)


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


def test_a_folder_not_in_the_layout_is_named(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    np.savetxt(folder / "data.csv.gz", np.ones((20, 3)), delimiter=",")
    np.savetxt(folder / "test_mask.csv.gz", np.zeros((20, 9)), delimiter=",", fmt="%d")
    with pytest.raises(ValueError, match=r"not in the uci_datasets layout.*\(20, 9\).*expected \(20, 10\)"):
        load_uci("bad", data_dir=tmp_path)


def test_synthetic_additive_is_standardized_and_seeded():
    a = synthetic_additive(300, 50, 4, seed=1)
    b = synthetic_additive(300, 50, 4, seed=1)
    assert torch.equal(a.train_x, b.train_x) and a.test_x.shape == (50, 4)
    assert float(a.train_y.mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(a.train_y.std(unbiased=False)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="d must be a positive int"):
        synthetic_additive(10, 10, 0)


# ---------------------------------------------------------------- the real copy (may skip)


def test_real_pol_has_the_published_shape(data_dir):
    raw, mask = read_raw(data_dir / "pol")
    assert raw.shape == (15000, 27) and mask.shape == (15000, 10)
    assert (mask.sum(1) == 1).all(), "every point is a test point of exactly one split"
    data = load_uci("pol", split=0, data_dir=data_dir)
    assert (data.n_train, data.n_test, data.d) == (13500, 1500, 26)


def test_checksums_match_the_shared_copy(data_dir):
    folders = sorted(p.name for p in data_dir.iterdir() if (p / "data.csv.gz").exists())
    assert set(folders) <= set(DATASETS)
    for name in folders:
        for file, expected in zip(FILES, SHA256[name]):
            assert hashlib.sha256((data_dir / name / file).read_bytes()).hexdigest() == expected, (name, file)


# ---------------------------------------------------------------- download path (local mirror, no network)


def test_download_verifies_and_caches(uci_mirror, uci_fixture, tmp_path, monkeypatch, capsys):
    server, _ = uci_mirror
    cache = tmp_path / "cache"
    folder = fetch_uci("yacht", cache_dir=cache, base_url=server.url)
    assert folder == cache / "yacht"
    assert sorted(server.requests) == ["/uci/yacht/data.csv.gz", "/uci/yacht/test_mask.csv.gz"]
    for file in FILES:
        assert (folder / file).read_bytes() == (uci_fixture.root / "yacht" / file).read_bytes()
    assert not list(folder.glob("*.part"))
    assert capsys.readouterr().err == "", "no progress bar unless asked for"

    fetch_uci("yacht", cache_dir=cache, base_url=server.url)
    assert len(server.requests) == 2, "a verified cache must not be downloaded again"

    # A cached file damaged on disk is detected and fetched again, with a progress bar when asked.
    (folder / "test_mask.csv.gz").write_bytes(b"damaged")
    fetch_uci("yacht", cache_dir=cache, base_url=server.url, progress=True)
    assert server.requests[2:] == ["/uci/yacht/test_mask.csv.gz"]
    assert f"downloading {server.url}/yacht/test_mask.csv.gz" in capsys.readouterr().err

    # load_uci falls back to the cache (XDG_CACHE_HOME) and the mirror (LAZYKERN_UCI_URL).
    monkeypatch.delenv("LAZYKERN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("LAZYKERN_UCI_URL", server.url)
    data = load_uci("yacht", split=2)
    assert (tmp_path / "xdg" / "lazykern" / "uci" / "yacht" / "data.csv.gz").is_file()
    raw, mask = uci_fixture.raw("yacht")
    assert (data.n_train, data.n_test, data.d) == (int((~mask[:, 2]).sum()), int(mask[:, 2].sum()), raw.shape[1] - 1)


def test_corrupted_download_is_rejected_and_not_cached(uci_mirror, tmp_path):
    server, served = uci_mirror
    payload = bytearray((served / "data.csv.gz").read_bytes())
    payload[len(payload) // 2] ^= 0xFF
    (served / "data.csv.gz").write_bytes(bytes(payload))
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError, match="SHA-256 .* expected; the file was rejected and not cached"):
        fetch_uci("yacht", cache_dir=cache, base_url=server.url)
    assert not (cache / "yacht" / "data.csv.gz").exists()
    assert not list((cache / "yacht").glob("*.part"))


def free_port() -> int:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offline_is_a_clear_error(tmp_path):
    with pytest.raises(DownloadError, match="could not download .*set LAZYKERN_DATA"):
        fetch_uci("yacht", cache_dir=tmp_path, base_url=f"http://127.0.0.1:{free_port()}")
    assert not (tmp_path / "yacht" / "data.csv.gz").exists()


def test_download_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="unknown UCI dataset"):
        fetch_uci("nosuchdata", cache_dir=tmp_path)
