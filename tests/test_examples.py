"""The examples run end to end (small sizes, the suite's UCI-layout fixture or synthetic data), write
their files into ``--out``, and end a mistake in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .conftest import ROOT


def run_example(script, args, data_root=None):
    env = {k: v for k, v in os.environ.items() if k != "LAZYKERN_DATA"}
    if data_root is not None:
        env["LAZYKERN_DATA"] = str(data_root)
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_uci_regression_writes_predictions_in_original_units(uci_fixture, tmp_path):
    proc = run_example("uci_regression.py", ["pol", "--n-train", "200", "--iters", "5", "--out", str(tmp_path)],
                       uci_fixture.root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pol: n_train=200, n_test=40, d=26" in proc.stdout and "mean predictor: RMSE" in proc.stdout
    table = np.loadtxt(tmp_path / "uci_regression_pol.csv", delimiter=",", skiprows=1)
    raw, mask = uci_fixture.raw("pol")
    np.testing.assert_allclose(table[:, 0], raw[mask[:, 0], -1], rtol=1e-5)
    assert (table[:, 2] > 0).all(), "predictive standard deviations"


def test_additive_components_plots_every_input(tmp_path):
    proc = run_example("additive_components.py", ["synthetic", "--n-train", "200", "--iters", "5",
                                                  "--out", str(tmp_path / "new")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    png = tmp_path / "new" / "additive_components_synthetic-additive.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in proc.stdout


def test_kernel_ridge_reports_each_preconditioner_and_plots_convergence(uci_fixture, tmp_path):
    proc = run_example("kernel_ridge_uci.py", ["--dataset", "pol", "--n-train", "300", "--precond", "none", "nystrom",
                                               "--alpha", "1", "--out", str(tmp_path)], uci_fixture.root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if "precond=" in line]
    assert [line.split()[0] for line in lines] == ["precond=none", "precond=nystrom"]
    assert all("converged=True" in line for line in lines)
    assert "CG, precond=nystrom" in proc.stderr, "a progress bar per solve"
    assert (tmp_path / "kernel_ridge_pol.png").is_file()


def test_bo_additive_runs_every_configuration(tmp_path):
    proc = run_example("bo_additive.py", ["--quick", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = [json.loads(line) for line in (tmp_path / "bo_additive.jsonl").read_text().splitlines()]
    configs = {(r["problem"], r["model"], r["acquisition"]) for r in runs}
    assert len(configs) == len(runs) == 11 and ("st4", "lazykern-no-priors", "qlogei") in configs
    assert all(len(r["best"]) == 2 and r["best"][1] >= r["best"][0] for r in runs), "best so far, 1 iteration"
    assert (tmp_path / "bo_additive.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| lazykern | ts | 1 |" in (tmp_path / "bo_additive.md").read_text()


@pytest.mark.parametrize(
    "script, args, message",
    [
        ("uci_regression.py", ["nosuchdata"], "unknown UCI dataset 'nosuchdata'"),
        ("kernel_ridge_uci.py", ["--precond", "cholesky"], "invalid choice: 'cholesky'"),
        ("bo_additive.py", ["--problems", "st20", "rosenbrock9"], "unknown problem 'rosenbrock9'"),
    ],
)
def test_mistakes_are_one_line(uci_fixture, script, args, message):
    proc = run_example(script, args, uci_fixture.root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"{script}: error: ") and message in proc.stderr
