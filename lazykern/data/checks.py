"""What the UCI loader reads, checked: gzip, CSV shape, numbers, finite values, the split's points.

A dataset folder of the uci_datasets layout holds two gzip-compressed CSV files without a header:
``data.csv.gz`` (one row per point: the inputs, then the target) and ``test_mask.csv.gz`` (one row
per point, one 0/1 column per standard split). Each file is parsed by NumPy in one pass and every
check is vectorized over the parsed array; only once a problem is found is the file read again, line
by line, to say where it is. A problem raises :class:`DataError`: one line naming the file, the row
and the column, what was found and what was expected.

What is checked, and why:

- the file is gzip-compressed and complete (a cut download ends in the middle of its stream);
- every row has the first row's number of columns, and every field is a number;
- every value of ``data.csv.gz`` is finite, in every row of the file: a NaN or infinite value in a
  training row would spread through the training statistics into every standardized value, and a
  split or ``n_train`` subset must not use a damaged row or leave it out by chance;
- ``test_mask.csv.gz`` has a row per data row and a 0 (training) or 1 (test) per split;
- the split has at least :data:`MIN_TRAINING_POINTS` training points and one test point, its
  training targets vary and its training inputs are not all one point.

Repeated points are accepted otherwise: real datasets hold many (``docs/uci.rst``, "What the loader
checks"), and an exact GP with a noise term fits them.
"""

from __future__ import annotations

import gzip
import os
import warnings
import zlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .layout import FILES, NUM_SPLITS

__all__ = ["DataError", "MIN_TRAINING_POINTS", "check_split", "check_training", "first_row", "read_dataset"]

MIN_TRAINING_POINTS = 2
"""Fewest training points a split or an ``n_train`` subset may have: standardizing divides by their
spread, and learning a lengthscale needs two distinct inputs."""

CONVENTION = "rows are lines of the decompressed file, rows and columns count from 1"
"""How a :class:`DataError` counts rows and columns, said in every message that names one."""

_GZIP_MAGIC = b"\x1f\x8b"


class DataError(ValueError):
    """A dataset file that does not hold what the uci_datasets layout promises.

    The message is one line: the file, the row and column where the problem lies (where it lies in
    one; rows are lines of the decompressed file as a text editor numbers them, columns are the
    comma-separated fields, both counted from 1, and a column of ``data.csv.gz`` is also named as
    the input ``x0``, ``x1``, ... or the target), then what was found and what was expected.

    Args:
        file: the file.
        problem: what was found and what was expected.
        row: the row (line) of the problem, counted from 1, or ``None``.
        column: the column (field) of the problem, counted from 1, or ``None``.
        column_name: what the column holds, e.g. ``"input x2"``.

    Attributes:
        file: the file, a :class:`~pathlib.Path`.
        row: the row counted from 1, or ``None``.
        column: the column counted from 1, or ``None``.

    Example:
        >>> from lazykern.data import DataError
        >>> err = DataError("yacht/data.csv.gz", "expected a number, found 'abc'", row=5, column=3,
        ...                 column_name="input x2")
        >>> print(err)  # doctest: +NORMALIZE_WHITESPACE
        yacht/data.csv.gz, row 5, column 3 (input x2): expected a number, found 'abc'
        (rows are lines of the decompressed file, rows and columns count from 1)
        >>> isinstance(err, ValueError), err.row, err.column
        (True, 5, 3)
    """

    def __init__(self, file: str | os.PathLike, problem: str, row: int | None = None, column: int | None = None,
                 column_name: str | None = None) -> None:
        self.file, self.problem, self.row, self.column, self.column_name = Path(file), problem, row, column, column_name
        where = [f"row {row}"] if row is not None else []
        if column is not None:
            where.append(f"column {column}" + (f" ({column_name})" if column_name else ""))
        note = f" ({CONVENTION})" if where else ""
        super().__init__(", ".join([str(file), *where]) + f": {problem}{note}")

    def __reduce__(self):
        # Rebuilt from its parts (the default would pass the message alone to __init__), so that it
        # crosses process boundaries (multiprocessing, torch.distributed) intact.
        return type(self), (self.file, self.problem, self.row, self.column, self.column_name)


def _data_column(column: int, width: int) -> str:
    return "the target" if column == width else f"input x{column - 1}"


def _mask_column(column: int, width: int) -> str:
    return f"split {column - 1}"


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(row, text)`` of each non-empty line, rows counted from 1; a broken gzip stream or text that is
    not UTF-8 raises :class:`DataError` where it breaks. Empty lines are skipped, as NumPy skips them."""
    row = 0
    try:
        with gzip.open(path, "rb") as f:
            for row, raw in enumerate(f, start=1):
                text = raw.decode("utf-8").rstrip("\r\n")
                if text:
                    yield row, text
    except UnicodeDecodeError:
        raise DataError(path, "found bytes that are not text; expected comma-separated numbers", row=row) from None
    except EOFError:
        after = f", after row {row}" if row else ""  # the whole rows that came out before the end
        raise DataError(path, f"ends in the middle of its gzip stream{after}: the file is cut short (an "
                        "interrupted download or copy?); copy or download it again") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        with open(path, "rb") as f:
            head = f.read(2)
        if head != _GZIP_MAGIC:
            raise DataError(path, f"is not gzip-compressed (it begins with {head!r}); expected a gzip-compressed CSV "
                            "file, as the uci_datasets layout stores them (compress it with gzip, or copy or "
                            "download it again)") from None
        # No row: a damaged stream decompresses to garbage (rows that are not the file's) before it fails.
        raise DataError(path, f"is damaged ({err}); copy or download it again") from None


def first_row(path: str | os.PathLike) -> str:
    """The first non-empty line of a gzip-compressed CSV file, without reading the rest; a file that
    is not gzip, is cut short, damaged, not text or empty raises :class:`DataError` saying so.

    Example:
        >>> import gzip, tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "data.csv.gz"
        >>> _ = path.write_bytes(gzip.compress(b"1,2,3\\n4,5,6\\n"))
        >>> first_row(path)
        '1,2,3'
    """
    path = Path(path)
    lines = _lines(path)
    try:
        return next(lines)[1]
    except StopIteration:
        raise DataError(path, "is empty; expected comma-separated numbers") from None
    finally:
        lines.close()  # closes the gzip file now, not when the generator is collected


def _row_of(path: Path, index: int) -> int:
    """The file row (counted from 1) of row ``index`` of the parsed table, which has no empty lines."""
    for k, (row, _) in enumerate(_lines(path)):
        if k == index:
            return row
    raise AssertionError(f"{path} has fewer than {index + 1} rows")  # the table was parsed from this file


def _diagnose(path: Path, name: Callable[[int, int], str]) -> None:
    """Raise :class:`DataError` at the first row that is not comma-separated numbers (the slow path, run
    only once NumPy has failed on the file). The file is read to its end first: a damaged gzip stream
    decompresses to garbage before its checksum fails, and the damage, not the garbage, is the problem."""
    width = first = problem = None
    for row, text in _lines(path):
        if problem is not None:
            continue
        fields = text.split(",")
        if width is None:
            width, first = len(fields), row
        elif len(fields) != width:
            problem = DataError(path, f"has {len(fields)} column{'' if len(fields) == 1 else 's'}, expected {width} "
                                f"as in row {first}", row=row)
            continue
        for column, field in enumerate(fields, start=1):
            value = field.strip()
            try:
                float(value)
            except ValueError:
                found = repr(value) if value else "an empty field"
                header = "; the files of the uci_datasets layout have no header row" if row == first else ""
                problem = DataError(path, f"expected a number, found {found}{header}", row=row, column=column,
                                    column_name=name(column, width))
                break
    if problem is not None:
        raise problem


def _read_table(path: Path, name: Callable[[int, int], str]) -> np.ndarray:
    """The numbers of one gzip-compressed CSV file as a 2-D float64 array (one row per non-empty line)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f, warnings.catch_warnings():
            # An empty file is "too few rows", said by the caller; NumPy would also warn on stderr.
            warnings.filterwarnings("ignore", "loadtxt: input contained no data", UserWarning)
            table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2, comments=None)
    except (ValueError, EOFError, gzip.BadGzipFile, zlib.error) as err:  # UnicodeDecodeError is a ValueError
        _diagnose(path, name)
        raise DataError(path, f"does not read as comma-separated numbers ({err})") from None
    return table


def _first(bad: np.ndarray) -> tuple[int, int]:
    index, column = np.argwhere(bad)[0]
    return int(index), int(column)


def read_dataset(folder: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read and check a dataset folder of the uci_datasets layout: its rows and its test mask.

    Every row of both files is checked (see the module's list), whichever split or subset will be used.

    Args:
        folder: the folder holding ``data.csv.gz`` and ``test_mask.csv.gz``.

    Returns:
        ``data``, an ``(n, d + 1)`` float64 array (inputs, then the target), and ``test``, an
        ``(n, 10)`` boolean array (``True``: a test point of that split).

    Raises:
        DataError: a file that is not gzip, cut short, ragged, not numbers, not finite, or not in the layout.

    Example:
        >>> import gzip, tempfile
        >>> from pathlib import Path
        >>> from lazykern.data.checks import read_dataset
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "data.csv.gz").write_bytes(gzip.compress(b"1,2\\n3,nan\\n"))
        >>> _ = (folder / "test_mask.csv.gz").write_bytes(gzip.compress(b"0,0,0,0,0,0,0,0,0,0\\n" * 2))
        >>> read_dataset(folder)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lazykern.data.checks.DataError: .../data.csv.gz, row 2, column 2 (the target): expected a finite number, ...
    """
    data_file, mask_file = (Path(folder) / file for file in FILES)
    data = _read_table(data_file, _data_column)
    mask = _read_table(mask_file, _mask_column)
    n, width = data.shape
    if n == 0 or width < 2:
        raise DataError(data_file, f"holds {n} rows of {width} columns; expected one row per point: d >= 1 inputs, "
                        "then the target")
    if mask.shape != (n, NUM_SPLITS):
        raise DataError(mask_file, f"is not in the uci_datasets layout: shape {mask.shape}, expected ({n}, "
                        f"{NUM_SPLITS}): a row per row of {FILES[0]}, a 0/1 column per standard split")
    finite = np.isfinite(data)
    if not finite.all():
        index, column = _first(~finite)
        raise DataError(data_file, f"expected a finite number, found {data[index, column]}; every row of the file is "
                        "checked, whichever split or subset uses it", row=_row_of(data_file, index),
                        column=column + 1, column_name=_data_column(column + 1, width))
    binary = (mask == 0) | (mask == 1)
    if not binary.all():
        index, column = _first(~binary)
        raise DataError(mask_file, f"expected 0 (a training point) or 1 (a test point), found {mask[index, column]:g}",
                        row=_row_of(mask_file, index), column=column + 1,
                        column_name=_mask_column(column + 1, NUM_SPLITS))
    return data, mask == 1


def check_split(folder: str | os.PathLike, test: np.ndarray, split: int) -> None:
    """Check that ``split`` has at least :data:`MIN_TRAINING_POINTS` training points and one test point.

    Args:
        folder: the dataset folder (named in the error).
        test: ``(n,)`` booleans, the split's column of the test mask.
        split: the split's index.

    Raises:
        DataError: too few training or test points, naming the mask's column.

    Example:
        >>> import numpy as np
        >>> from lazykern.data.checks import check_split
        >>> check_split("yacht", np.array([False, False, True]), 0)
        >>> check_split("yacht", np.array([False, False, False]), 3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lazykern.data.checks.DataError: yacht/test_mask.csv.gz, column 4 (split 3): split 3 has no test points (1s); ...
    """
    mask_file = Path(folder) / FILES[1]
    n_test = int(test.sum())
    where = dict(column=split + 1, column_name=_mask_column(split + 1, NUM_SPLITS))
    n_train = test.size - n_test
    if n_train < MIN_TRAINING_POINTS:
        raise DataError(mask_file, f"split {split} has {n_train} training point{'' if n_train == 1 else 's'} (0s); "
                        f"expected at least {MIN_TRAINING_POINTS} (standardizing divides by their spread)", **where)
    if n_test == 0:
        raise DataError(mask_file, f"split {split} has no test points (1s); expected at least one", **where)


def check_training(folder: str | os.PathLike, data: np.ndarray, rows: np.ndarray, split: int, subset: bool) -> None:
    """Check that the chosen training rows can be standardized and fitted: a target that varies, and
    inputs that are not all one point.

    Args:
        folder: the dataset folder (its ``data.csv.gz`` is named in the error).
        data: the ``(n, d + 1)`` rows of the dataset.
        rows: indices of the training rows (at least :data:`MIN_TRAINING_POINTS`).
        split: the split's index.
        subset: whether ``rows`` are a random ``n_train`` subset of the split's training rows.

    Raises:
        DataError: a constant target, or identical inputs, naming the file, column or row.

    Example:
        >>> import numpy as np
        >>> from lazykern.data.checks import check_training
        >>> data = np.array([[0.0, 1.0], [1.0, 1.0], [2.0, 5.0]])
        >>> check_training("yacht", data, np.array([0, 2]), 0, subset=False)
        >>> check_training("yacht", data, np.array([0, 1]), 0, subset=False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lazykern.data.checks.DataError: yacht/data.csv.gz, column 2 (the target): the target is 1 at all 2 ...
    """
    data_file = Path(folder) / FILES[0]
    train = data[rows]
    width = data.shape[1]
    points = f"{rows.size} training points of split {split}" + (" (the n_train subset)" if subset else "")
    if (train[:, -1] == train[0, -1]).all():
        raise DataError(data_file, f"the target is {train[0, -1]:g} at all {points}; expected a target that varies "
                        "(standardizing divides by its spread)", column=width, column_name=_data_column(width, width))
    if (train[:, :-1] == train[0, :-1]).all():
        raise DataError(data_file, f"all {points} have the inputs of this row; expected at least "
                        f"{MIN_TRAINING_POINTS} distinct points", row=_row_of(data_file, int(rows[0])))
