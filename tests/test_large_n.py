"""Every training point on a CPU: the large-N recipe against an exact fit of the same model, and the
command that runs it by default (its budgets, its progress line, Ctrl-C, bad input).

The data are UCI-shaped fixtures of a little more than the command's 2,000-point CPU default, so that
the large-N recipe applies; its budgets are cut to a few iterations (speed is measured in
``benchmarks/uci_full.py``, not here).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import gpytorch
import pytest
import torch

from lazykern import regression
from lazykern.cli import main

from .conftest import write_uci_fixture

F64 = torch.float64


@pytest.fixture(scope="module")
def large_fixture(tmp_path_factory):
    """``kin40k``-named data of 2,500 points in 4 dimensions: 2,250 training points in each split."""
    return write_uci_fixture(tmp_path_factory.mktemp("uci-large"), {"kin40k": (2500, 4)})


def test_the_recipe_predicts_what_an_exact_fit_of_its_model_does():
    """LARGE_N (budgets cut) on 2,400 points: its predictive mean, solved by preconditioned CG in
    float64, equals the dense Cholesky posterior mean of the same model at the same hyperparameters
    to 1e-6, and its variances (the grid model's) the exact ones to the check's tolerance."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2600, 3, generator=g, dtype=F64) * 4 - 2
    y = torch.sin(2 * x[:, 0] + x[:, 1]) + 0.5 * x[:, 2] ** 2 + 0.05 * torch.randn(2600, generator=g, dtype=F64)
    y = (y - y[:2400].mean()) / y[:2400].std()
    recipe = regression.Recipe(**{**regression.LARGE_N.__dict__, "iters": 3, "warm_start_iters": 3,
                                  "warm_start_size": 500, "ard_start": 500, "solve_tolerance": 1e-10})
    result = regression.fit_evaluate(x[:2400], y[:2400], x[2400:], y[2400:], kernel="dpa-matern52-learned",
                                     num_projections=6, recipe=recipe, analyze=False, progress=False)
    assert result.solver == "cg" and result.warm_start_size == 500 and result.warm_start_iterations <= 3
    assert result.iterations <= 3 and math.isfinite(result.nlpd)
    model, likelihood = result.model, result.likelihood
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(recipe.max_cholesky_size), \
            gpytorch.settings.eval_cg_tolerance(1e-10):
        mean, variance = regression.predict(model, likelihood, x[2400:])
        train_x = model.train_inputs[0]
        K = model.covar_module(train_x).to_dense()
        cross = model.covar_module(x[2400:].to(train_x), train_x).to_dense()
        noise = likelihood.noise.item()
        A = K + noise * torch.eye(K.shape[0], dtype=F64)
        residual = model.train_targets - model.mean_module.constant
        exact = model.mean_module.constant + cross @ torch.linalg.solve(A, residual)
        exact_var = model.covar_module(x[2400:].to(train_x), diag=True) + noise \
            - (cross * torch.linalg.solve(A, cross.mT).mT).sum(-1)
    assert float((mean - exact).abs().max()) <= 1e-6 * float(exact.abs().max())
    assert float(((variance - exact_var) / exact_var).abs().max()) <= regression.prediction.VARIANCE_CHECK_TOLERANCE


@pytest.mark.slow
def test_the_command_trains_on_every_point_by_default_within_its_budgets(large_fixture, capsys):
    """``lazykern uci NAME`` on a CPU with more than 2,000 training points: the large-N kernel on all of
    them; --warm-start-iters bounds the subset's fit and --iters the steps on all points."""
    os.environ["LAZYKERN_DATA"] = str(large_fixture.root)
    try:
        assert main(["uci", "kin40k", "--iters", "2", "--warm-start-iters", "3", "--projections", "4",
                     "--quiet", "--json", "-"]) == 0
    finally:
        del os.environ["LAZYKERN_DATA"]
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert (record["kernel"], record["n_train"], record["num_projections"]) == ("dpa-matern52-learned", 2250, 4)
    assert (record["solver"], record["optimizer_used"], record["warm_start_size"]) == ("cg", "adam", 2000)
    assert record["warm_start_iterations"] <= 3 and record["iterations"] <= 2 and record["iters"] == 2
    assert math.isfinite(record["rmse"]) and math.isfinite(record["nlpd"]) and record["noise_floor"] > 0
    assert "all training points (the large-N recipe" in captured.err


def test_a_kernel_the_recipe_does_not_fit_trains_on_the_cpu_default_subset(large_fixture):
    from lazykern.cli.parser import build_parser
    from lazykern.cli.plan import plan

    args = build_parser().parse_args(["uci", "kin40k", "--kernel", "rbf-ard"])
    assert not plan(args, on_cpu=True, available=2250, num_dims=4).full_set
    args = build_parser().parse_args(["uci", "kin40k", "--n-train", "2100"])
    job = plan(args, on_cpu=True, available=2100, num_dims=4)
    assert (job.kernel, job.full_set) == ("additive-ng", False)
    args = build_parser().parse_args(["uci", "kin40k", "--max-cholesky", "500"])
    assert plan(args, on_cpu=True, available=2250, num_dims=4).recipe.warm_start_size == 500


@pytest.mark.parametrize("flags, message", [
    (["--warm-start-iters", "0"], "argument --warm-start-iters: expected an integer >= 1, got '0'"),
    (["--compare"], "--compare trains ARD kernels, whose products cost O(N^2): not on all 2250 training points"),
    (["--kernel", "rbf-ard", "--warm-start-iters", "5"], "--warm-start-iters applies with --warm-start M only"),
    (["--max-degree", "9"], "--max-degree 9 exceeds the 4 input dimensions of kin40k"),
])
def test_bad_input_is_one_line(large_fixture, flags, message):
    proc = subprocess.run([sys.executable, "-m", "lazykern", "uci", "kin40k", *flags], capture_output=True, text=True,
                          env={**os.environ, "LAZYKERN_DATA": str(large_fixture.root)}, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"lazykern: error: {proc.stderr.split('error: ', 1)[1].strip()}"]
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_ctrl_c_ends_the_job_in_one_line(large_fixture):
    """SIGINT while the progress line runs: exit status 130, the line cleared, one line said, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "lazykern", "uci", "kin40k", "--projections", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LAZYKERN_DATA": str(large_fixture.root)})
    seen, started = [], threading.Event()

    def read() -> None:
        for char in iter(lambda: proc.stderr.read(1), ""):
            seen.append(char)
            if "fit" in "".join(seen[-40:]):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(300), "".join(seen)[-2000:]
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    err = "".join(seen)
    assert proc.returncode == 130, err[-2000:]
    assert err.rstrip().splitlines()[-1].strip() == "lazykern: interrupted" and "Traceback" not in err


def test_python_m_lazykern_is_the_command():
    proc = subprocess.run([sys.executable, "-m", "lazykern", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("lazykern ")
