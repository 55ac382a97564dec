"""The UCI regression benchmarks in the uci_datasets layout: locate, download, verify, split.

A dataset is a folder holding ``data.csv.gz`` (one row per point, the last column is the target)
and ``test_mask.csv.gz`` (one row per point, 10 columns of 0/1: the 10 standard 90/10 train/test
splits). The folder is looked for, in order, in

1. the ``data_dir`` argument,
2. the ``LAZYKERN_DATA`` environment variable,
3. the download cache (``$XDG_CACHE_HOME/lazykern/uci``, by default ``~/.cache/lazykern/uci``),
   filled on first use from the public uci_datasets repository and checked against the SHA-256
   digests in :mod:`lazykern.data.checksums`.

The data are Trefor Evans' uci_datasets collection (github.com/treforevans/uci_datasets, MIT
licence): the regression datasets of the UCI machine learning repository, cleaned, with the
standard splits used across the Gaussian-process literature. The original datasets keep the terms
of the UCI repository and of their donors.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from torch import Tensor
from tqdm.auto import tqdm

from .checks import MIN_TRAINING_POINTS, check_split, check_training, read_dataset
from .checksums import SHA256
from .layout import FILES, NUM_SPLITS, default_cache_dir

__all__ = [
    "DATASETS",
    "DEFAULT_BASE_URL",
    "NUM_SPLITS",
    "DownloadError",
    "UCISplit",
    "default_cache_dir",
    "fetch_uci",
    "load_uci",
    "locate_uci",
]

DATASETS: tuple[str, ...] = tuple(SHA256)
"""Names of the datasets that can be downloaded (the folders of the uci_datasets repository)."""

DEFAULT_BASE_URL = "https://raw.githubusercontent.com/treforevans/uci_datasets/master/uci_datasets"
"""Where :func:`fetch_uci` downloads from unless ``base_url`` or ``LAZYKERN_UCI_URL`` says otherwise."""

_TIMEOUT_SECONDS = 60


class DownloadError(OSError):
    """A dataset file could not be downloaded, or its SHA-256 digest did not match (nothing was cached)."""


@dataclass(frozen=True)
class UCISplit:
    r"""One train/test split of a UCI dataset, standardized with training statistics.

    Inputs and targets are standardized with the mean and standard deviation of the training
    points (after subsampling), :math:`\tilde x = (x - \mu_x) / \sigma_x`,
    :math:`\tilde y = (y - \mu_y) / \sigma_y`; constant training columns keep :math:`\sigma = 1`.
    A prediction :math:`\tilde y` is :math:`\sigma_y \tilde y + \mu_y` in original units, so an RMSE
    scales by :math:`\sigma_y` and a Gaussian negative log density shifts by :math:`\log \sigma_y`.

    Attributes:
        name: dataset name (folder name).
        split: index of the split, 0-9.
        train_x: ``(n_train, d)`` standardized training inputs.
        train_y: ``(n_train,)`` standardized training targets.
        test_x: ``(n_test, d)`` test inputs, standardized with the training statistics.
        test_y: ``(n_test,)`` test targets, standardized with the training statistics.
        x_mean: ``(d,)`` training input means :math:`\mu_x` (original units).
        x_std: ``(d,)`` training input standard deviations :math:`\sigma_x`.
        y_mean: training target mean :math:`\mu_y`.
        y_std: training target standard deviation :math:`\sigma_y`.

    Example:
        >>> from lazykern.data import synthetic_additive
        >>> data = synthetic_additive(n_train=50, n_test=10, d=3)
        >>> data.train_x.shape, data.test_x.shape, data.d
        (torch.Size([50, 3]), torch.Size([10, 3]), 3)
        >>> bool(abs(data.y_to_original(data.train_y).mean() - data.y_mean) < 1e-9)
        True
    """

    name: str
    split: int
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    x_mean: Tensor
    x_std: Tensor
    y_mean: float
    y_std: float

    @property
    def n_train(self) -> int:
        """Number of training points."""
        return self.train_x.shape[0]

    @property
    def n_test(self) -> int:
        """Number of test points."""
        return self.test_x.shape[0]

    @property
    def d(self) -> int:
        """Number of input dimensions."""
        return self.train_x.shape[1]

    def y_to_original(self, y: Tensor) -> Tensor:
        r"""Standardized targets or predictions back in original units, :math:`\sigma_y y + \mu_y`."""
        return y * self.y_std + self.y_mean


def split_of_arrays(name: str, split: int, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                    test_y: np.ndarray, statistics: tuple[np.ndarray, np.ndarray, float, float], dtype: torch.dtype,
                    device: str | torch.device) -> UCISplit:
    """A :class:`UCISplit` of standardized NumPy arrays, as tensors of ``dtype`` on ``device``;
    ``statistics`` are the training ``(x_mean, x_std, y_mean, y_std)``."""

    def tensor(a: np.ndarray) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

    x_mean, x_std, y_mean, y_std = statistics
    return UCISplit(name=name, split=split, train_x=tensor(train_x), train_y=tensor(train_y), test_x=tensor(test_x),
                    test_y=tensor(test_y), x_mean=tensor(x_mean), x_std=tensor(x_std), y_mean=float(y_mean),
                    y_std=float(y_std))


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (a dataset name such as 'pol'), got {type(name).__name__}")
    if name not in DATASETS:
        raise ValueError(f"unknown UCI dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    return name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(url: str, target: Path, expected_sha256: str, progress: bool) -> None:
    # Written to a temporary file in the cache folder and renamed only once the digest matches, so
    # an interrupted or corrupted download never looks like a cached file.
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=_TIMEOUT_SECONDS) as response, tqdm(
                    total=int(response.headers.get("Content-Length") or 0) or None, unit="B", unit_scale=True,
                    desc=f"downloading {url}", disable=not progress,
                ) as bar:
                    for block in iter(lambda: response.read(1 << 16), b""):
                        digest.update(block)
                        out.write(block)
                        bar.update(len(block))
            except (urllib.error.URLError, OSError) as err:
                reason = getattr(err, "reason", err)
                raise DownloadError(
                    f"could not download {url} ({reason}); connect to the internet, or set LAZYKERN_DATA "
                    "to a local copy of the uci_datasets folders"
                ) from None
        if digest.hexdigest() != expected_sha256:
            raise DownloadError(
                f"{url} has SHA-256 {digest.hexdigest()} but {expected_sha256} was expected; the file was "
                "rejected and not cached (retry, or set LAZYKERN_DATA to a verified local copy)"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def fetch_uci(
    name: str, cache_dir: str | os.PathLike | None = None, base_url: str | None = None, *, progress: bool = False
) -> Path:
    """Download a dataset's two files into the cache (once) and return its folder.

    Each file is fetched from ``{base_url}/{name}/{file}``, its SHA-256 compared with
    ``lazykern.data.checksums.SHA256``, and only then moved into ``{cache_dir}/{name}/``.
    Cached files are re-verified on every call and downloaded again if they differ. Concurrent
    calls (threads or processes) are serialized by a lock file in the dataset folder.

    Args:
        name: dataset name, one of :data:`DATASETS`.
        cache_dir: cache root (default :func:`default_cache_dir`).
        base_url: URL of the folder that holds one sub-folder per dataset (default: the
            ``LAZYKERN_UCI_URL`` environment variable, else :data:`DEFAULT_BASE_URL`).
        progress: show a progress bar (on stderr) while a file downloads.

    Raises:
        DownloadError: offline, HTTP error, or a digest mismatch (nothing is cached then).

    Example:
        >>> from lazykern.data import fetch_uci
        >>> folder = fetch_uci("yacht")  # doctest: +SKIP
        >>> sorted(p.name for p in folder.glob("*.csv.gz"))  # doctest: +SKIP
        ['data.csv.gz', 'test_mask.csv.gz']
    """
    name = _check_name(name)
    folder = Path(cache_dir if cache_dir is not None else default_cache_dir()) / name
    base_url = (base_url or os.environ.get("LAZYKERN_UCI_URL") or DEFAULT_BASE_URL).rstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / ".lock")):
        for file, expected in zip(FILES, SHA256[name]):
            target = folder / file
            if target.exists() and _sha256(target) == expected:
                continue
            _download(f"{base_url}/{name}/{file}", target, expected, progress)
    return folder


def locate_uci(name: str, data_dir: str | os.PathLike | None = None, *, progress: bool = False) -> Path:
    """The folder holding a dataset's files: ``data_dir``, else ``LAZYKERN_DATA``, else the download cache.

    A folder given explicitly (argument or environment variable) must hold the dataset; nothing is
    downloaded into it. Any folder in the uci_datasets layout is accepted there, also one whose
    name is not in :data:`DATASETS`.

    Args:
        name: dataset name (the folder name).
        data_dir: folder holding one sub-folder per dataset.
        progress: show a progress bar (on stderr) if the dataset has to be downloaded.

    Example:
        >>> import pathlib, tempfile
        >>> from lazykern.data import locate_uci
        >>> root = pathlib.Path(tempfile.mkdtemp()); (root / "toy").mkdir()
        >>> for name in ("data.csv.gz", "test_mask.csv.gz"):
        ...     _ = (root / "toy" / name).write_bytes(b"")
        >>> locate_uci("toy", root) == root / "toy"
        True
        >>> import shutil; shutil.rmtree(root)
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (a dataset name such as 'pol'), got {type(name).__name__}")
    source = "data_dir"
    if data_dir is None and os.environ.get("LAZYKERN_DATA"):
        data_dir, source = os.environ["LAZYKERN_DATA"], "LAZYKERN_DATA"
    if data_dir is None:
        return fetch_uci(name, progress=progress)
    root = Path(data_dir)
    folder = root / name
    if all((folder / file).is_file() for file in FILES):
        return folder
    if not root.is_dir():
        raise FileNotFoundError(
            f"data folder {root} (from {source}) does not exist; point {source} at the folder that holds "
            "one sub-folder per dataset, or unset it to download the data"
        )
    _check_name(name)
    raise FileNotFoundError(
        f"{folder} (from {source}) lacks {' or '.join(FILES)}; copy the dataset there, point {source} at a "
        "complete uci_datasets folder, or unset it to download the data"
    )


def _standardize(train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = train.mean(axis=0)
    # A column whose training values are all equal carries no information: divide it by 1. Its std is
    # 0 only up to the rounding of the mean, and dividing by that rounding makes a test value a little
    # away an enormous standardized one (docs/uci.rst, "Training that does not fail").
    constant = (train == train[:1]).all(axis=0)
    return mean, np.where(constant, 1.0, train.std(axis=0))


def _checked_arguments(split: int, n_train: int | None, seed: int, dtype: torch.dtype,
                       device: str | torch.device) -> torch.device:
    """:func:`load_uci`'s arguments checked before any file is read; returns the device."""
    if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split < NUM_SPLITS:
        raise ValueError(f"split must be an int in 0..{NUM_SPLITS - 1}, got {split!r}")
    if n_train is not None and (
        isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < MIN_TRAINING_POINTS
    ):
        raise ValueError(f"n_train must be a positive int of at least {MIN_TRAINING_POINTS} (standardizing divides by "
                         f"the training points' spread) or None (all training points), got {n_train!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}") from err
    return device


def _training_rows(rows: np.ndarray, n_train: int | None, seed: int, what: str) -> np.ndarray:
    """The split's training ``rows``, or ``n_train`` of them drawn without replacement with ``seed``
    and kept in file order."""
    if n_train is None:
        return rows
    if n_train > rows.size:
        raise ValueError(f"n_train={n_train} exceeds the {rows.size} training points of {what}")
    chosen = np.random.default_rng(seed).choice(rows.size, size=n_train, replace=False)
    return rows[np.sort(chosen)]


def load_uci(
    name: str,
    split: int = 0,
    *,
    n_train: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
    data_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> UCISplit:
    r"""Load one train/test split of a UCI dataset as standardized tensors.

    The training points of the split (``test_mask[:, split] == 0``) are optionally subsampled to
    ``n_train`` points without replacement (the same ``seed`` gives the same subset, kept in file
    order); inputs and targets are then standardized with the training mean and standard deviation
    (see :class:`UCISplit`). The test points are always all of the split's test points.

    Args:
        name: dataset name, e.g. ``"pol"`` (see :data:`DATASETS`).
        split: which of the 10 standard splits, 0-9.
        n_train: number of training points to keep, at least 2 (default: all of them).
        seed: seed of the subsampling.
        dtype: ``torch.float32`` or ``torch.float64``.
        device: device of the returned tensors.
        data_dir: folder with one sub-folder per dataset (see :func:`locate_uci`).
        progress: show a progress bar (on stderr) if the dataset has to be downloaded.

    Raises:
        ValueError: a bad argument value (checked before any file is read).
        TypeError: an argument of the wrong type (checked before any file is read).
        FileNotFoundError: the data folder lacks the dataset.
        DataError: a file that does not hold what the layout promises (a :class:`ValueError` naming the
            file, row and column): not gzip or cut short, a ragged row, a field that is not a number,
            a NaN or infinite value anywhere in the file (whichever rows the split and ``n_train``
            use), a mask that is not 0/1, fewer than 2 training points or no test point, a constant
            training target, or training inputs that are all one point.
        DownloadError: the dataset had to be downloaded and could not be.

    Example:
        A folder of the layout with 20 points, 5 of them test points in every split:

        >>> import gzip, pathlib, tempfile, numpy as np, torch
        >>> from lazykern.data import load_uci
        >>> root = pathlib.Path(tempfile.mkdtemp()); (root / "toy").mkdir()
        >>> mask = np.zeros((20, 10), dtype=int); mask[:5] = 1
        >>> for name, table, fmt in (("data.csv.gz", np.random.default_rng(0).normal(size=(20, 3)), "%.6f"),
        ...                          ("test_mask.csv.gz", mask, "%d")):
        ...     with gzip.open(root / "toy" / name, "wt") as f:
        ...         np.savetxt(f, table, delimiter=",", fmt=fmt)
        >>> data = load_uci("toy", n_train=12, dtype=torch.float32, data_dir=root)
        >>> data.n_train, data.n_test, data.d, abs(float(data.train_y.mean())) < 1e-6
        (12, 5, 2, True)
        >>> import shutil; shutil.rmtree(root)
    """
    device = _checked_arguments(split, n_train, seed, dtype, device)

    folder = locate_uci(name, data_dir, progress=progress)
    data, test_mask = read_dataset(folder)
    test = test_mask[:, split]
    check_split(folder, test, split)
    train_rows = _training_rows(np.flatnonzero(~test), n_train, seed, f"{name} split {split}")
    check_training(folder, data, train_rows, split, subset=n_train is not None)
    train, test_data = data[train_rows], data[test]
    mean, std = _standardize(train)
    train, test_data = (train - mean) / std, (test_data - mean) / std
    return split_of_arrays(name, split, train[:, :-1], train[:, -1], test_data[:, :-1], test_data[:, -1],
                           (mean[:-1], std[:-1], float(mean[-1]), float(std[-1])), dtype, device)
