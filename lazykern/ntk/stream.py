r"""The whole empirical NTK written block by block into a destination: a streamed, resumable job.

:func:`~lazykern.ntk.empirical_ntk` with ``out=`` calls :func:`write_ntk`. The kernel is cut into
square tiles of ``B`` samples a side (the last ones shorter); each tile forms the features of its
row block and of its column block (:func:`lazykern.ntk.features.extract`, the forms the cost rule
picks for a ``B x B`` block) and their Gram (``lazykern.ntk.products.dense``), and is written
into the destination. A symmetric kernel (``x2`` omitted) forms the tiles on and above the diagonal
and mirrors them. What is held at once: the features of two blocks and one tile, whatever the
number of samples; :func:`block_size` picks the largest ``B`` whose features and tile fit
:class:`lazykern.settings.max_dense_bytes` (or ``block_size=`` fixes it).

A file destination (a path ending in ``.npy``) is created as a NumPy ``.npy`` file and written
through a memory map; beside it, ``NAME.npy.progress.json`` records the tiles written (replaced
atomically after each tile's data is flushed) and fingerprints of the model's parameters and
buffers, the inputs, the mode and the tile size, and the backward way of the feature extraction
(the faster on the first block; pinned, so that a resumed job writes the same bits as an
uninterrupted one on the same machine and thread count). Running the same job again continues where it
stopped (after Ctrl-C, or a killed process, the file holds every recorded tile; the tile in flight is
formed again) and refuses, in one line, a model, an input or a mode that changed.

Inputs may be tensors, map-style ``torch.utils.data.Dataset`` objects (``dataset[i]`` a sample, or
a tuple whose first element is the sample) or ``DataLoader`` objects over them (their dataset in
order, collated by their ``collate_fn``): only the samples of the two blocks of a tile are on the
device at once.

Example:
    >>> import tempfile, os, torch
    >>> from lazykern.ntk import empirical_ntk
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    >>> x = torch.randn(10, 3, dtype=torch.float64)
    >>> path = os.path.join(tempfile.mkdtemp(), "ntk.npy")
    >>> K = empirical_ntk(net, x, mode="trace", out=path, block_size=4, progress=False)
    >>> K.shape, bool(abs(torch.from_numpy(K[:]) - empirical_ntk(net, x, mode="trace").to_dense()).max() < 1e-12)
    ((10, 10), True)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sized

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, SequentialSampler
from tqdm.auto import tqdm

from ..operators.dense_cache import DENSE_CACHE
from ..validation import check_samples
from . import features as feat
from . import products
from .plan import MODES, NTKPlan, apply_forms, build
from .throughput import synchronize

__all__ = ["NTKJobSummary", "block_size", "write_ntk"]

RECORD_SUFFIX = ".progress.json"
_RECORD_VERSION = 1


# ---------------------------------------------------------------------------- inputs
class _Samples:
    """Random access to a sample set by row ranges: a tensor, a map-style Dataset or a DataLoader."""

    def __init__(self, name: str, source: Any) -> None:
        self.name = name
        self.collate = None
        if isinstance(source, DataLoader):
            if not isinstance(source.sampler, SequentialSampler) or isinstance(source.dataset, IterableDataset):
                raise ValueError(f"{name}: a DataLoader must read its map-style dataset in order (shuffle=False, "
                                 "no sampler): the kernel's rows follow the dataset's order")
            self.collate, source = source.collate_fn, source.dataset
        # A map-style dataset has a length (torch's Dataset does not declare one).
        if isinstance(source, IterableDataset) or not (isinstance(source, (Tensor, Dataset)) and isinstance(source, Sized)):
            raise TypeError(f"{name} must be a torch.Tensor, a map-style torch.utils.data.Dataset or a DataLoader "
                            f"over one, got {type(source).__name__}")
        if isinstance(source, Tensor):
            check_samples(name, source)
        self.source = source
        self.count = len(source)
        if self.count == 0:
            raise ValueError(f"{name} must not be empty")

    def __len__(self) -> int:
        return self.count

    def take(self, rows: slice, device: torch.device) -> Tensor:
        if isinstance(self.source, Tensor):
            return self.source[rows].to(device)
        items = [self.source[i] for i in range(rows.start, rows.stop)]
        batch = self.collate(items) if self.collate is not None else torch.stack([_sample(s) for s in items])
        return _sample(batch).to(device)

    def fingerprint(self, device: torch.device, step: int) -> str:
        digest = hashlib.sha256()
        for start in range(0, self.count, step):
            _digest(digest, self.take(slice(start, min(self.count, start + step)), torch.device("cpu")))
        return digest.hexdigest()


def _digest(digest: Any, t: Tensor) -> None:
    """Add a tensor's shape, dtype and bytes to a hash."""
    digest.update(f"{tuple(t.shape)}{t.dtype}".encode())
    digest.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())


def _sample(item: Any) -> Tensor:
    """A dataset item's sample: the item, or the first element of a tuple or list (inputs, targets)."""
    if isinstance(item, (tuple, list)):
        item = item[0]
    if not isinstance(item, Tensor):
        item = torch.as_tensor(item)
    return item


# ---------------------------------------------------------------------------- the block plan
def block_size(plan: NTKPlan, n1: int, n2: int) -> int:
    r"""The largest tile side :math:`B` (samples) whose features and tile fit the dense budget:
    :math:`2 B f + B^2 k^2 s \le` :class:`lazykern.settings.max_dense_bytes`, with :math:`f` the
    feature bytes of one sample (the forms of ``plan``), :math:`k` the outputs per sample in full
    mode (1 in trace mode) and :math:`s` the item size; at least 1, at most the larger side.

    Example:
        >>> import torch
        >>> from lazykern.ntk import empirical_ntk
        >>> from lazykern import settings
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        >>> plan = empirical_ntk(net, torch.randn(100, 3), mode="trace", plan=True)
        >>> with settings.max_dense_bytes(2**20):
        ...     block_size(plan, 100, 100) <= 100
        True
    """
    k = plan.outputs if plan.mode == "full" else 1
    per_sample = plan.feature_bytes(1)
    tile = k * k * plan.itemsize
    budget = DENSE_CACHE.budget(plan.device)
    side = (-per_sample + math.sqrt(per_sample**2 + tile * budget)) / tile
    return max(1, min(max(n1, n2), int(side)))


def _blocks(n: int, side: int) -> list[slice]:
    return [slice(s, min(n, s + side)) for s in range(0, n, side)]


def _tiles(rows: list[slice], cols: list[slice], symmetric: bool) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(rows)) for j in range(len(cols)) if not symmetric or j >= i]


# ---------------------------------------------------------------------------- destinations
class _Destination:
    """Where tiles go: a tensor, a NumPy array (or memmap), or an ``.npy`` file with a progress record."""

    def __init__(self, out: Any, shape: tuple[int, int], dtype: torch.dtype) -> None:
        self.shape, self.dtype = shape, dtype
        self.record_path: Path | None = None
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        if isinstance(out, (str, os.PathLike)):
            path = Path(out)
            if path.suffix != ".npy":
                raise ValueError(f"out={str(path)!r}: a file destination must end in .npy")
            if not path.parent.is_dir():
                raise ValueError(f"out={str(path)!r}: folder {path.parent} does not exist")
            self.path, self.record_path = path, Path(str(path) + RECORD_SUFFIX)
            if not path.exists():
                self.record_path.unlink(missing_ok=True)  # a record whose file was deleted: start again
            elif not self.record_path.exists():
                raise ValueError(f"out={str(path)!r} exists but has no progress record ({self.record_path.name}): "
                                 "it is not a kernel this function started; delete it or choose another path")
            if path.exists():
                self.array = np.load(path, mmap_mode="r+")
            else:
                self.array = np.lib.format.open_memmap(path, mode="w+", dtype=np_dtype, shape=shape)
            self._check(self.array.shape, self.array.dtype, np_dtype, f"out={str(path)!r}")
            self.result: Any = self.array
        elif isinstance(out, Tensor):
            self._check(tuple(out.shape), out.dtype, dtype, "out")
            self.array, self.result = out, out
        elif isinstance(out, np.ndarray):
            self._check(out.shape, out.dtype, np_dtype, "out")
            self.array, self.result = out, out
        else:
            raise TypeError(f"out must be a torch.Tensor, a numpy array or memmap, or a path ending in .npy, "
                            f"got {type(out).__name__}")

    def _check(self, shape: tuple, dtype: Any, expected_dtype: Any, what: str) -> None:
        if tuple(shape) != self.shape or dtype != expected_dtype:
            raise ValueError(f"{what} must be a {self.shape[0]} x {self.shape[1]} array of {expected_dtype} "
                             f"(the kernel's shape and the model's dtype), got shape {tuple(shape)} of {dtype}")

    def write(self, rows: slice, cols: slice, tile: Tensor) -> None:
        if isinstance(self.array, Tensor):
            self.array[rows, cols] = tile.to(self.array.device)
        else:
            self.array[rows, cols] = tile.detach().cpu().numpy()

    def flush(self) -> None:
        if isinstance(self.array, np.memmap):
            self.array.flush()

    def read_record(self) -> dict | None:
        if self.record_path is None or not self.record_path.exists():
            return None
        try:
            record = json.loads(self.record_path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{self.record_path}: unreadable progress record ({err}); delete it and "
                             f"{self.path.name} to start again") from None
        if record.get("version") != _RECORD_VERSION:
            raise ValueError(f"{self.record_path}: progress record of another version; delete it and "
                             f"{self.path.name} to start again")
        return record

    def write_record(self, record: dict) -> None:
        if self.record_path is None:
            return
        tmp = self.record_path.with_name(self.record_path.name + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.record_path)  # atomic: a killed job leaves the old record or the new one


# ---------------------------------------------------------------------------- the job
@dataclass
class NTKJobSummary:
    """What :func:`write_ntk` did: tiles formed now and found done, features formed, bytes written,
    seconds per tile. ``str()`` is the one-line summary the job prints."""

    shape: tuple[int, int]
    block: int
    tiles: int
    resumed: int = 0
    feature_samples: int = 0
    bytes_written: int = 0
    tile_seconds: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(self.tile_seconds)

    def __str__(self) -> str:
        median = statistics.median(self.tile_seconds) if self.tile_seconds else 0.0
        return (f"NTK {self.shape[0]} x {self.shape[1]} in tiles of {self.block} samples: {len(self.tile_seconds)} of "
                f"{self.tiles} tiles formed ({self.resumed} already done), features formed for "
                f"{self.feature_samples} samples, {self.bytes_written / 2**20:.1f} MiB written, "
                f"{self.seconds:.1f} s ({median:.2f} s per tile, median)")


def _model_fingerprint(tensors: Mapping[str, Tensor]) -> str:
    digest = hashlib.sha256()
    for name, t in tensors.items():
        digest.update(name.encode())
        _digest(digest, t)
    return digest.hexdigest()


def _resume(dest: _Destination, fingerprints: dict[str, str]) -> set[tuple[int, int]]:
    record = dest.read_record()
    if record is None:
        return set()
    assert dest.path is not None and dest.record_path is not None  # a record: a file destination
    what = {"model": "the model's parameters or buffers", "x1": "x1", "x2": "x2",
            "job": "the mode, forms or tile size"}
    for key, text in what.items():
        if record["fingerprints"].get(key) != fingerprints[key]:
            raise ValueError(f"out={str(dest.path)!r}: {text} differ from those its progress record was written "
                             f"with; run the original job to finish it, or delete {dest.path.name} and "
                             f"{dest.record_path.name} to start again")
    return {tuple(t) for t in record["done"]}


#: Samples on which a job times the two backward ways (a stream of several extraction batches).
WAY_PROBE_SAMPLES = 256


def _faster_way(network: feat.Network, tensors: dict[str, Tensor], x: Tensor, device: torch.device) -> str:
    """The job's one backward way: the faster on ``x``, each timed once after an untimed warm-up (the
    first use of either loads what it needs). Both ways are exact but round differently, so the job
    keeps its way in the progress record: a resumed job writes the same bits as an uninterrupted one."""
    for way in feat.BACKWARD_WAYS:
        feat.extract(network, tensors, x[:2], way=way)
    seconds = {}
    for way in feat.BACKWARD_WAYS:
        synchronize(device)
        started = time.perf_counter()
        feat.extract(network, tensors, x, way=way)
        synchronize(device)
        seconds[way] = time.perf_counter() - started
    return min(seconds, key=seconds.__getitem__)


def write_ntk(
    model: nn.Module,
    x1: Any,
    x2: Any = None,
    *,
    mode: str,
    out: Any,
    forms: str | Mapping[str, str] | None = None,
    block: int | None = None,
    progress: bool = True,
) -> Any:
    r"""The empirical NTK of ``model`` written tile by tile into ``out``; see the module docstring
    and :func:`~lazykern.ntk.empirical_ntk` (its ``out=`` and ``block_size=``).

    Returns ``out`` (a path: the file, opened as a ``numpy.memmap``). With ``progress``, a progress
    bar over the kernel's pairs and, at the end, the :class:`NTKJobSummary` line, on stderr.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block_size must be a positive int, got {block!r}")
    job = _Job(model, x1, x2, mode, out, forms, block)
    job.run(progress)
    if progress:
        print(job.summary, file=sys.stderr)
    return job.dest.result


class _Job:
    """One kernel written into one destination: its samples, plan and tiles, and the tiles done.

    A resumed job keeps the tile size and backward way of its progress record, so that it writes
    the same bits as an uninterrupted one."""

    def __init__(self, model: nn.Module, x1: Any, x2: Any, mode: str, out: Any,
                 forms: str | Mapping[str, str] | None, block: int | None) -> None:
        self.mode = mode
        self.rows_src = _Samples("x1", x1)
        self.symmetric = x2 is None or x2 is x1
        self.cols_src = self.rows_src if self.symmetric else _Samples("x2", x2)
        n1, n2 = len(self.rows_src), len(self.cols_src)
        self.device = next((t.device for t in feat.model_tensors(model).values()), torch.device("cpu"))
        probe = self.rows_src.take(slice(0, min(n1, 64)), self.device)
        other = None if self.symmetric else self.cols_src.take(slice(0, min(n2, 64)), self.device)
        self.network, plan, self.tensors = build(model, probe, other, mode=mode, backend="dense", forms=forms,
                                                 sample_ndim=probe.dim() - 1)
        self.k = plan.outputs if mode == "full" else 1
        self.itemsize = plan.itemsize
        self.dest = _Destination(out, (n1 * self.k, n2 * self.k), plan.dtype)
        record = self.dest.read_record()
        if block is None:  # a resumed job keeps its tiles
            block = record["block"] if record is not None else block_size(plan, n1, n2)
        self.block = block
        side = min(block, max(n1, n2))
        # the forms the cost rule picks for one tile (the network's pieces are the plan's)
        apply_forms(plan.pieces, forms, mode, min(n1, side), min(n2, side), plan.itemsize, shared=self.symmetric,
                    device=plan.device)
        forms_used = {p.name: p.form for p in plan.pieces}
        self.fingerprints = {
            "model": _model_fingerprint(self.tensors),
            "x1": self.rows_src.fingerprint(self.device, side),
            "x2": "x1" if self.symmetric else self.cols_src.fingerprint(self.device, side),
            "job": hashlib.sha256(json.dumps([mode, forms_used, block, str(plan.dtype),
                                              list(self.dest.shape)]).encode()).hexdigest(),
        }
        self.done = _resume(self.dest, self.fingerprints) if record is not None else set()
        self.way = record.get("way") if record is not None else None
        self.row_blocks, self.col_blocks = _blocks(n1, side), _blocks(n2, side)
        self.tiles = _tiles(self.row_blocks, self.col_blocks, self.symmetric)
        self.summary = NTKJobSummary(self.dest.shape, side, len(self.tiles),
                                     resumed=sum(t in self.done for t in self.tiles))

    def pairs(self, tile: tuple[int, int]) -> int:
        r, c = self.row_blocks[tile[0]], self.col_blocks[tile[1]]
        return (r.stop - r.start) * (c.stop - c.start)

    def save(self) -> None:
        """Flush the data, then record the tiles written (a record never names a tile not on disk)."""
        self.dest.flush()
        self.dest.write_record({"version": _RECORD_VERSION, "fingerprints": self.fingerprints, "block": self.block,
                                "way": self.way, "shape": list(self.dest.shape), "done": sorted(self.done)})

    def features(self, source: _Samples, rows: slice) -> list:
        x = source.take(rows, self.device)
        self.summary.feature_samples += rows.stop - rows.start
        if self.way is None and len(self.tiles) > 1:  # one tile is never written by two runs: nothing to pin
            self.way = _faster_way(self.network, self.tensors, x[:WAY_PROBE_SAMPLES], self.device)
        return feat.extract(self.network, self.tensors, x, way=self.way)

    def run(self, progress: bool) -> None:
        """Form and write every tile not done yet, one row block's features at a time."""
        self.save()
        bar = tqdm(total=sum(self.pairs(t) for t in self.tiles if t not in self.done), unit="pair", unit_scale=True,
                   disable=not progress, file=sys.stderr, desc="NTK tiles")
        try:
            with torch.no_grad():
                for i, rows in enumerate(self.row_blocks):
                    todo = [j for (a, j) in self.tiles if a == i and (a, j) not in self.done]
                    if todo:
                        self.write_row(i, rows, todo, bar)
        finally:
            bar.close()
            self.dest.flush()

    def write_row(self, i: int, rows: slice, todo: list[int], bar: Any) -> None:
        """The tiles ``(i, j)`` of row block ``i`` for ``j`` in ``todo``, each recorded once written."""
        f1 = self.features(self.rows_src, rows)
        for j in todo:
            started = time.perf_counter()
            cols = self.col_blocks[j]
            same = self.symmetric and i == j
            f2 = f1 if same else self.features(self.cols_src, cols)
            tile = products.dense(f1, f2, self.mode)
            r = slice(rows.start * self.k, rows.stop * self.k)
            c = slice(cols.start * self.k, cols.stop * self.k)
            self.dest.write(r, c, tile)
            self.summary.bytes_written += tile.numel() * self.itemsize
            if self.symmetric and not same:
                self.dest.write(c, r, tile.T)
                self.summary.bytes_written += tile.numel() * self.itemsize
            del f2, tile
            self.done.add((i, j))
            self.save()
            self.summary.tile_seconds.append(time.perf_counter() - started)
            bar.update(self.pairs((i, j)))
