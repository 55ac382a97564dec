"""The ``lazykern`` command: end-to-end runs in a subprocess, and one-line usage errors (exit 2)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from lazykern.cli import main

FIELDS = (
    "dataset", "split", "kernel", "n_train", "n_test", "d", "dtype", "device", "iters", "rmse", "nlpd",
    "rmse_original", "nlpd_original", "train_seconds", "predict_seconds", "peak_memory_mb", "hyperparameters",
)


def run_cli(args, env_extra=None, use_script=False, timeout=600):
    env = {**os.environ, **(env_extra or {})}
    script = shutil.which("lazykern") if use_script else None
    command = [script] if script else [sys.executable, "-m", "lazykern.cli"]
    return subprocess.run(command + list(args), capture_output=True, text=True, env=env, timeout=timeout)


def test_uci_pol_writes_every_field(data_dir, tmp_path):
    out = tmp_path / "out.json"
    proc = run_cli(["uci", "pol", "--n-train", "1000", "--iters", "10", "--json", str(out)],
                   {"LAZYKERN_DATA": str(data_dir)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert set(FIELDS) <= set(record)
    assert (record["dataset"], record["split"], record["kernel"]) == ("pol", 0, "additive-rbf")
    assert (record["n_train"], record["n_test"], record["d"], record["iters"]) == (1000, 1500, 26, 10)
    assert record["dtype"] == "float32" and record["device"] == "cpu"
    assert math.isfinite(record["rmse"]) and record["rmse"] < 1.0, "worse than predicting the mean"
    assert math.isfinite(record["nlpd"]) and math.isfinite(record["nlpd_original"])
    assert record["rmse_original"] > record["rmse"], "pol's targets have a standard deviation above 1"
    assert len(record["hyperparameters"]["covar_module.base_kernel.base_kernel.lengthscale"]) == 26
    assert "n_train=1000" in proc.stdout and "test RMSE" in proc.stdout


def test_demo_runs_from_the_console_script(tmp_path):
    out = tmp_path / "demo.json"
    proc = run_cli(["demo", "--n-train", "600", "--n-test", "200", "--iters", "20", "--json", str(out)],
                   use_script=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["dataset"] == "synthetic-additive" and record["d"] == 6
    assert record["rmse"] < 0.5, "an additive kernel fits an additive function well"


@pytest.mark.parametrize(
    "args, message",
    [
        (["uci", "nosuchdata"], "unknown UCI dataset 'nosuchdata'"),
        (["uci", "pol", "--split", "10"], "split must be an int in 0..9"),
        (["uci", "pol", "--n-train", "99999"], "exceeds the 13500 training points"),
        (["uci", "pol", "--kernel", "nosuchkernel"], "invalid choice: 'nosuchkernel'"),
        (["uci", "pol", "--iters", "0"], "expected an integer >= 1, got '0'"),
        (["uci", "pol", "--lr", "-1"], "expected a positive number"),
        (["uci", "pol", "--json", "/nonexistent/folder/out.json"], "folder /nonexistent/folder does not exist"),
        (["uci"], "the following arguments are required: dataset"),
        ([], "the following arguments are required: COMMAND"),
        (["fly"], "invalid choice: 'fly'"),
    ],
)
def test_usage_errors_are_one_line(data_dir, monkeypatch, capsys, args, message):
    monkeypatch.setenv("LAZYKERN_DATA", str(data_dir))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lazykern: error: "), err
    assert message in err


def test_missing_data_folder_says_how_to_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAZYKERN_DATA", str(tmp_path))
    assert main(["uci", "pol"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lacks data.csv.gz" in err and "LAZYKERN_DATA" in err
    assert main(["uci", "pol", "--data-dir", str(tmp_path / "absent")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["uci", "nosuchdata"], ["uci", "pol", "--dtype", "float16"]])
def test_usage_errors_exit_2_without_traceback(data_dir, args):
    proc = run_cli(args, {"LAZYKERN_DATA": str(data_dir)}, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("lazykern: error: ")
