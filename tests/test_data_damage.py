"""Damaged dataset files: each test builds a uci_datasets-layout folder (``write_uci_fixture``), damages
one file as a cut download, a hand edit or a bad export would, and checks that the loader, the
``lazykern uci`` command and every example answer in one line naming the file, row and column
(rows are lines of the decompressed file, both counted from 1), with exit status 2 and no traceback.
"""

from __future__ import annotations

import gzip
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from lazykern.cli import main
from lazykern.data import DataError, load_uci

from .conftest import write_uci_fixture
from .test_cli import run_cli
from .test_examples import run_example

N, D = 120, 6  # the fixture's yacht: 120 rows of 6 inputs and the target (7 columns)
WIDTH = D + 1
CONVENTION = "(rows are lines of the decompressed file, rows and columns count from 1)"


def read_lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().splitlines()


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))


def set_field(path: Path, row: int, column: int, text: str) -> None:
    """Replace the field at ``row``, ``column`` (both counted from 1) of a gzip CSV file."""
    lines = read_lines(path)
    fields = lines[row - 1].split(",")
    fields[column - 1] = text
    lines[row - 1] = ",".join(fields)
    write_lines(path, lines)


@dataclass(frozen=True)
class Expected:
    file: str
    row: int | None
    column: int | None
    text: str


def split0_rows(mask: np.ndarray, test: bool) -> np.ndarray:
    """File rows (from 1) of split 0's training (``test=False``) or test rows."""
    return np.flatnonzero(mask[:, 0] == test) + 1


def truncated(folder, mask):
    payload = (folder / "data.csv.gz").read_bytes()
    (folder / "data.csv.gz").write_bytes(payload[: len(payload) // 2])
    return Expected("data.csv.gz", None, None, "ends in the middle of its gzip stream, after row")


def not_gzip(folder, mask):
    (folder / "data.csv.gz").write_bytes(gzip.decompress((folder / "data.csv.gz").read_bytes()))  # gunzipped in place
    return Expected("data.csv.gz", None, None, "is not gzip-compressed (it begins with b'")


def corrupted(folder, mask):
    # One byte flipped: the stream decompresses to garbage rows before its checksum fails; the damage is named.
    payload = bytearray((folder / "data.csv.gz").read_bytes())
    payload[len(payload) // 2] ^= 0xFF
    (folder / "data.csv.gz").write_bytes(bytes(payload))
    return Expected("data.csv.gz", None, None, "is damaged (")


def ragged(folder, mask):
    lines = read_lines(folder / "data.csv.gz")
    lines[4] = lines[4].rsplit(",", 1)[0]
    write_lines(folder / "data.csv.gz", lines)
    return Expected("data.csv.gz", 5, None, f"has {WIDTH - 1} columns, expected {WIDTH} as in row 1")


def text_field(folder, mask):
    set_field(folder / "data.csv.gz", 7, 3, "abc")
    return Expected("data.csv.gz", 7, 3, "column 3 (input x2): expected a number, found 'abc'")


def empty_field(folder, mask):
    set_field(folder / "data.csv.gz", 8, WIDTH, "")
    return Expected("data.csv.gz", 8, WIDTH, f"column {WIDTH} (the target): expected a number, found an empty field")


def header(folder, mask):
    lines = read_lines(folder / "data.csv.gz")
    write_lines(folder / "data.csv.gz", [",".join(f"x{k}" for k in range(WIDTH))] + lines)
    return Expected("data.csv.gz", 1, 1, "found 'x0'; the files of the uci_datasets layout have no header row")


def nan_in_training_row(folder, mask):
    row = int(split0_rows(mask, test=False)[3])
    set_field(folder / "data.csv.gz", row, 2, "nan")
    return Expected("data.csv.gz", row, 2, "column 2 (input x1): expected a finite number, found nan")


def nan_in_test_row(folder, mask):
    row = int(split0_rows(mask, test=True)[2])
    set_field(folder / "data.csv.gz", row, WIDTH, "NaN")
    return Expected("data.csv.gz", row, WIDTH, "(the target): expected a finite number, found nan")


def plus_inf(folder, mask):
    set_field(folder / "data.csv.gz", 11, 1, "inf")
    return Expected("data.csv.gz", 11, 1, "column 1 (input x0): expected a finite number, found inf")


def minus_inf(folder, mask):
    set_field(folder / "data.csv.gz", N, 4, "-inf")
    return Expected("data.csv.gz", N, 4, "expected a finite number, found -inf")


def blank_line_before_nan(folder, mask):
    # NumPy skips empty lines, so the parsed table's row 20 is the file's row 22: the error names the file's.
    for file in ("data.csv.gz", "test_mask.csv.gz"):
        lines = read_lines(folder / file)
        write_lines(folder / file, lines[:5] + [""] + lines[5:10] + [""] + lines[10:])
    set_field(folder / "data.csv.gz", 22, 2, "nan")
    return Expected("data.csv.gz", 22, 2, "expected a finite number, found nan")


def not_text(folder, mask):
    payload = gzip.decompress((folder / "data.csv.gz").read_bytes()).split(b"\n")
    payload[9] = b"\xff\xfe" + payload[9]
    (folder / "data.csv.gz").write_bytes(gzip.compress(b"\n".join(payload)))
    return Expected("data.csv.gz", 10, None, "found bytes that are not text")


def constant_target(folder, mask):
    lines = read_lines(folder / "data.csv.gz")
    write_lines(folder / "data.csv.gz", [line.rsplit(",", 1)[0] + ",5" for line in lines])
    n_train = int((mask[:, 0] == 0).sum())
    return Expected("data.csv.gz", None, WIDTH,
                    f"column {WIDTH} (the target): the target is 5 at all {n_train} training points of split 0")


def duplicate_points(folder, mask):
    lines = read_lines(folder / "data.csv.gz")
    inputs = lines[0].rsplit(",", 1)[0]
    write_lines(folder / "data.csv.gz", [inputs + "," + line.rsplit(",", 1)[1] for line in lines])
    first = int(split0_rows(mask, test=False)[0])
    return Expected("data.csv.gz", first, None, "training points of split 0 have the inputs of this row; expected at "
                    "least 2 distinct points")


def too_few_training_points(folder, mask):
    column = np.ones(N, dtype=int)
    column[0] = 0
    write_mask_column(folder, mask, column)
    return Expected("test_mask.csv.gz", None, 1, "column 1 (split 0): split 0 has 1 training point (0s); expected at "
                    "least 2 (standardizing divides by their spread)")


def no_test_points(folder, mask):
    write_mask_column(folder, mask, np.zeros(N, dtype=int))
    return Expected("test_mask.csv.gz", None, 1, "split 0 has no test points (1s); expected at least one")


def write_mask_column(folder, mask, column):
    mask = mask.astype(int)
    mask[:, 0] = column
    write_lines(folder / "test_mask.csv.gz", [",".join(map(str, row)) for row in mask])


def mask_not_binary(folder, mask):
    set_field(folder / "test_mask.csv.gz", 6, 4, "2")
    return Expected("test_mask.csv.gz", 6, 4, "column 4 (split 3): expected 0 (a training point) or 1 (a test point), "
                    "found 2")


def mask_row_missing(folder, mask):
    write_lines(folder / "test_mask.csv.gz", read_lines(folder / "test_mask.csv.gz")[:-1])
    return Expected("test_mask.csv.gz", None, None, f"is not in the uci_datasets layout: shape ({N - 1}, 10), "
                    f"expected ({N}, 10)")


CASES: dict[str, Callable] = {f.__name__: f for f in (
    truncated, not_gzip, corrupted, ragged, text_field, empty_field, header, nan_in_training_row, nan_in_test_row,
    plus_inf, minus_inf, blank_line_before_nan, not_text, constant_target, duplicate_points, too_few_training_points,
    no_test_points, mask_not_binary, mask_row_missing,
)}


def damaged(root: Path, case: str) -> tuple[Path, Expected]:
    """A fixture yacht under ``root`` damaged by ``case``; returns the dataset folder and what the error says."""
    fixture = write_uci_fixture(root, {"yacht": (N, D)})
    _, mask = fixture.raw("yacht")
    folder = root / "yacht"
    return folder, CASES[case](folder, mask)


def error_lines(stderr: str) -> list[str]:
    """A fresh process's stderr without KeOps' import-time notice ("[KeOps] Warning : CUDA libraries not
    found ..." on a machine without CUDA): that line is KeOps' (lazykern routes it to stderr), not the error's."""
    return [line for line in stderr.splitlines() if not line.startswith("[KeOps]")]


def check_message(text: str, folder: Path, expected: Expected) -> None:
    """One line that starts with the file, then its row and column, and says what was expected."""
    where = ", ".join([str(folder / expected.file)]
                      + ([f"row {expected.row}"] if expected.row is not None else [])
                      + ([f"column {expected.column}"] if expected.column is not None else []))
    assert "\n" not in text and where in text and expected.text in text, text
    assert text.endswith(CONVENTION) == (expected.row is not None or expected.column is not None), text


@pytest.mark.parametrize("case", CASES)
def test_the_loader_names_file_row_and_column(tmp_path, case):
    folder, expected = damaged(tmp_path, case)
    with pytest.raises(DataError) as caught:
        load_uci("yacht", data_dir=tmp_path)
    err = caught.value
    assert isinstance(err, ValueError)
    assert (err.file, err.row, err.column) == (folder / expected.file, expected.row, expected.column)
    check_message(str(err), folder, expected)


@pytest.mark.parametrize("case", ["nan_in_training_row", "nan_in_test_row"])
def test_every_row_is_checked_whatever_the_subset(tmp_path, case):
    # A damaged row is refused whether or not the split or the n_train subset would use it.
    folder, expected = damaged(tmp_path, case)
    for split in (0, 5):
        for seed in range(3):
            with pytest.raises(DataError) as caught:
                load_uci("yacht", split=split, n_train=5, seed=seed, data_dir=tmp_path)
            assert caught.value.row == expected.row


def test_a_subset_with_one_target_value_is_refused(tmp_path):
    # The target varies over split 0's training rows (one row differs) but not over a 2-point subset
    # without that row (seed 0 does not pick it).
    fixture = write_uci_fixture(tmp_path, {"yacht": (N, D)})
    odd = int(split0_rows(fixture.raw("yacht")[1], test=False)[0])
    file = tmp_path / "yacht" / "data.csv.gz"
    write_lines(file, [line.rsplit(",", 1)[0] + ("," + ("1" if k == odd else "3")) for k, line in
                       enumerate(read_lines(file), start=1)])
    assert load_uci("yacht", data_dir=tmp_path).y_std > 0
    with pytest.raises(DataError, match=r"the target is 3 at all 2 training points of split 0 \(the n_train subset\)"):
        load_uci("yacht", n_train=2, data_dir=tmp_path)


def test_fewer_than_two_training_points_is_an_argument_error(tmp_path):
    write_uci_fixture(tmp_path, {"yacht": (N, D)})
    with pytest.raises(ValueError, match="n_train must be a positive int of at least 2"):
        load_uci("yacht", n_train=1, data_dir=tmp_path)


def test_an_intact_file_with_repeated_points_loads(tmp_path):
    # Repeated rows are real data (keggdirected repeats two thirds of its rows): only all-identical
    # training inputs are refused.
    fixture = write_uci_fixture(tmp_path, {"yacht": (N, D)})
    lines = read_lines(tmp_path / "yacht" / "data.csv.gz")
    write_lines(tmp_path / "yacht" / "data.csv.gz", lines[: N // 2] * 2)
    assert load_uci("yacht", data_dir=tmp_path).n_train == int((~fixture.raw("yacht")[1][:, 0]).sum())


def test_the_error_survives_pickling(tmp_path):
    err = DataError(tmp_path / "data.csv.gz", "expected a number, found 'abc'", row=3, column=2, column_name="input x1")
    copy = pickle.loads(pickle.dumps(err))
    assert (str(copy), copy.file, copy.row, copy.column) == (str(err), err.file, 3, 2)


# ---------------------------------------------------------------- the command


COMMAND_CASES = ["truncated", "not_gzip", "ragged", "text_field", "empty_field", "nan_in_training_row",
                 "nan_in_test_row", "plus_inf", "constant_target", "duplicate_points", "too_few_training_points"]


@pytest.mark.parametrize("case", COMMAND_CASES)
def test_the_command_answers_in_one_line(tmp_path, monkeypatch, capsys, case):
    folder, expected = damaged(tmp_path, case)
    monkeypatch.setenv("LAZYKERN_DATA", str(tmp_path))
    assert main(["uci", "yacht", "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("lazykern: error: ") and captured.err.count("\n") == 1
    check_message(captured.err.rstrip("\n"), folder, expected)


def test_the_command_with_n_train_reads_a_cut_mask_in_one_line(tmp_path, monkeypatch, capsys):
    # --n-train is checked against the split's size before torch is imported: a cut mask file is
    # left to the loader, which names it.
    write_uci_fixture(tmp_path, {"yacht": (N, D)})
    mask = tmp_path / "yacht" / "test_mask.csv.gz"
    mask.write_bytes(mask.read_bytes()[: mask.stat().st_size // 2])
    monkeypatch.setenv("LAZYKERN_DATA", str(tmp_path))
    assert main(["uci", "yacht", "--n-train", "10", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"lazykern: error: {mask}: ends in the middle of its gzip stream" in err


def test_the_command_exits_2_without_traceback(tmp_path):
    folder, expected = damaged(tmp_path, "truncated")
    proc = run_cli(["uci", "yacht"], {"LAZYKERN_DATA": str(tmp_path)}, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    lines = error_lines(proc.stderr)
    assert "Traceback" not in proc.stderr and len(lines) == 1 and lines[0].startswith("lazykern: error: "), proc.stderr
    check_message(lines[0], folder, expected)


# ---------------------------------------------------------------- the examples


EXAMPLES = [
    ("uci_regression.py", ["yacht", "--n-train", "50"]),
    ("additive_components.py", ["yacht", "--n-train", "50"]),
    ("kernel_ridge_uci.py", ["--dataset", "yacht", "--n-train", "50"]),
    ("interactions_uci.py", ["yacht", "--n-train", "50"]),
    ("distributed_gp.py", ["yacht", "--n-train", "50"]),
]


@pytest.mark.parametrize("script, args", EXAMPLES, ids=[script for script, _ in EXAMPLES])
def test_every_example_answers_in_one_line(tmp_path, script, args):
    # A NaN in a training row: before, it ended in a traceback ("test_x contains NaN") once the training
    # mean had spread it; the examples share the loader's one catch (examples/_common.py).
    folder, expected = damaged(tmp_path / "data", "nan_in_training_row")
    proc = run_example(script, [*args, "--out", str(tmp_path / "out")] if script != "distributed_gp.py" else args,
                       tmp_path / "data")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), proc.stderr
    check_message(lines[0], folder, expected)
