"""The ``lazykern`` command: end-to-end runs in a subprocess, what goes to stdout and stderr, one-line
usage errors (exit 2) answered before anything heavy is imported, and the download path."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import lazykern
from lazykern import kernel_names
from lazykern.cli import main

FIELDS = (
    "dataset", "split", "kernel", "n_train", "n_test", "d", "dtype", "device", "iters", "rmse", "nlpd",
    "rmse_original", "nlpd_original", "train_seconds", "predict_seconds", "peak_memory_mb", "hyperparameters",
    "mean_predictor", "optimizer", "optimizer_used", "evaluations", "tolerance", "max_degree", "order_shares",
    "dimension_shares", "analysis_kind", "float64_from", "computed_dtype",
)
HEAVY = ("torch", "gpytorch", "linear_operator", "pykeops", "keopscore", "numpy", "scipy")


def run_cli(args, env_extra=None, use_script=False, timeout=600, python_flags=()):
    env = {k: v for k, v in os.environ.items() if k != "LAZYKERN_DATA"}
    env.update(env_extra or {})
    # the script installed with the interpreter running the tests, not whichever one PATH finds first
    installed = Path(sysconfig.get_path("scripts")) / "lazykern"
    script = (str(installed) if installed.is_file() else shutil.which("lazykern")) if use_script else None
    command = [script] if script else [sys.executable, *python_flags, "-m", "lazykern.cli"]
    return subprocess.run(command + list(args), capture_output=True, text=True, env=env, timeout=timeout)


def test_uci_compare_reports_every_kernel_in_context(uci_fixture, tmp_path):
    out = tmp_path / "out.json"
    # additive-rbf, not the default: Newton-Girard over 26 orders costs 10x more on the torch engine.
    proc = run_cli(["uci", "pol", "--kernel", "additive-rbf", "--iters", "10", "--compare", "--json", str(out)],
                   {"LAZYKERN_DATA": str(uci_fixture.root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert set(FIELDS) <= set(record)
    assert (record["dataset"], record["split"], record["kernel"]) == ("pol", 0, "additive-rbf")
    assert (record["n_train"], record["n_test"], record["d"], record["iters"]) == (360, 40, 26, 10)
    assert record["dtype"] == "float32" and record["device"] == "cpu"
    assert math.isfinite(record["nlpd"]) and math.isfinite(record["nlpd_original"])
    assert len(record["hyperparameters"]["covar_module.base_kernel.base_kernel.lengthscale"]) == 26
    assert (record["optimizer"], record["optimizer_used"], record["solver"]) == ("auto", "lbfgs", "cholesky")
    assert record["order_shares"] == [1.0] and len(record["dimension_shares"]) == 26  # first order only

    # The mean predictor (training mean and variance: 0 and 1 standardized), from the raw test rows.
    raw, mask = uci_fixture.raw("pol")
    train_y, test_y = raw[~mask[:, 0], -1], raw[mask[:, 0], -1]
    z = (test_y - train_y.mean()) / train_y.std()
    mean = record["mean_predictor"]
    assert mean["rmse"] == pytest.approx(math.sqrt((z**2).mean()), rel=1e-5)
    assert mean["nlpd"] == pytest.approx(0.5 * math.log(2 * math.pi) + 0.5 * (z**2).mean(), rel=1e-5)
    assert mean["rmse_original"] == pytest.approx(math.sqrt(((test_y - train_y.mean()) ** 2).mean()), rel=1e-5)
    assert record["rmse"] < mean["rmse"], "the GP beats the mean predictor on a smooth target"

    # --compare: the same split under lazykern's and GPyTorch's ARD RBF kernels, same recipe.
    assert [r["kernel"] for r in record["compare"]] == ["rbf-ard", "gpytorch-rbf-ard"]
    for r in record["compare"]:
        assert (r["n_train"], r["n_test"], r["iters"]) == (360, 40, 10) and math.isfinite(r["rmse"])
        assert r["order_shares"] is None and r["max_degree"] is None
    lazy, gpytorch_rbf = record["compare"]

    table = proc.stdout[proc.stdout.index("same split"):]
    for row, r in [("mean predictor", mean), ("additive-rbf (this run)", record), ("rbf-ard", lazy),
                   ("gpytorch-rbf-ard (GPyTorch)", gpytorch_rbf)]:
        assert re.search(rf"{re.escape(row)}\s+{r['rmse']:.4f}\s+{r['nlpd']:.4f}", table), (row, table)
    assert "n_train=360: all training points" in proc.stdout
    assert "[KeOps]" not in proc.stdout + proc.stderr


def test_uci_pol_on_the_real_copy(data_dir, tmp_path):
    out = tmp_path / "out.json"
    # additive-rbf: the KeOps formula this test always compiled (1,000 points run on KeOps).
    proc = run_cli(["uci", "pol", "--kernel", "additive-rbf", "--n-train", "1000", "--iters", "10", "--json", str(out)],
                   {"LAZYKERN_DATA": str(data_dir)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert (record["n_train"], record["n_test"], record["d"]) == (1000, 1500, 26)
    assert record["rmse"] < record["mean_predictor"]["rmse"], "worse than predicting the mean"
    assert record["rmse_original"] > record["rmse"], "pol's targets have a standard deviation above 1"
    assert "n_train=1000 (--n-train)" in proc.stdout and "[KeOps]" not in proc.stdout


def test_demo_json_to_stdout_is_all_stdout_carries():
    proc = run_cli(["demo", "--n-train", "300", "--n-test", "100", "--iters", "20", "--json", "-"],
                   use_script=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout)  # nothing but the JSON: no report, no KeOps message
    assert record["dataset"] == "synthetic-additive" and record["d"] == 6 and record["n_train"] == 300
    assert record["rmse"] < 0.5, "an additive kernel fits an additive function well"
    # The default kernel: Newton-Girard over all 6 orders, trained by L-BFGS on the exact likelihood.
    assert (record["kernel"], record["max_degree"]) == (kernel_names.DEFAULT_KERNEL, 6)
    assert len(record["hyperparameters"]["covar_module.outputscale"]) == 6
    assert (record["optimizer"], record["optimizer_used"], record["solver"]) == ("auto", "lbfgs", "cholesky")
    assert len(record["order_shares"]) == 6 and abs(sum(record["order_shares"]) - 1) < 1e-5
    assert "order shares" in proc.stderr and "top inputs" in proc.stderr
    assert "test RMSE" in proc.stderr and "mean predictor" in proc.stderr
    assert "[KeOps]" not in proc.stderr, "KeOps' messages are shown with --verbose only"


def test_verbose_sends_keops_messages_to_stderr():
    import torch

    proc = run_cli(["demo", "--n-train", "50", "--n-test", "10", "--iters", "1", "--quiet", "--verbose"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[KeOps]" not in proc.stdout and "test RMSE" in proc.stdout
    if not torch.cuda.is_available():  # KeOps announces its CPU-only mode when imported
        assert "[KeOps] Warning" in proc.stderr


def imported_modules(proc: subprocess.CompletedProcess) -> set[str]:
    """Module names from ``python -X importtime`` (written to stderr)."""
    return {m.group(1).strip() for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", proc.stderr, re.M)}


@pytest.mark.parametrize(
    "args, status, stream, text",
    [
        (["--help"], 0, "stdout", "usage: lazykern"),
        (["demo", "--help"], 0, "stdout", "--compare"),
        (["--version"], 0, "stdout", f"lazykern {lazykern.__version__}"),
        (["demo", "--iters", "0"], 2, "stderr", "expected an integer >= 1"),
        (["uci", "pol", "--kernel", "nosuchkernel"], 2, "stderr", "invalid choice: 'nosuchkernel'"),
        (["demo", "--kernel", "rbf-ard", "--max-degree", "2"], 2, "stderr", "--max-degree applies to"),
        (["demo", "--kernel", "rbf-ard", "--plot", "c.png"], 2, "stderr", "--plot needs a kernel with additive"),
        (["precompile", "--help"], 0, "stdout", "--jobs"),
        (["precompile", "--jobs", "0"], 2, "stderr", "argument --jobs: expected an integer >= 1"),
        ([], 2, "stderr", "the following arguments are required: COMMAND"),
    ],
)
def test_answers_before_importing_anything_heavy(args, status, stream, text):
    proc = run_cli(args, python_flags=("-X", "importtime"))
    assert proc.returncode == status, proc.stderr[-2000:]
    assert text in getattr(proc, stream)
    modules = imported_modules(proc)
    assert "lazykern.cli" in modules or "lazykern" in modules, "importtime output was not parsed"
    assert not {m.split(".")[0] for m in modules} & set(HEAVY), sorted(m for m in modules if m.split(".")[0] in HEAVY)


@pytest.mark.parametrize(
    "args, text",
    [
        (["uci", "pol", "--split", "99"], "argument --split: expected one of the 10 standard splits"),
        (["uci", "pol", "--data-dir", "/missing"], "--data-dir /missing: folder does not exist"),
        (["uci", "pol", "--n-train", "99999", "--data-dir", "{root}"], "--n-train 99999 exceeds the 360 training"),
        (["uci", "NOPE"], "unknown UCI dataset 'NOPE': not in the uci_datasets collection"),
        (["uci", "NOPE", "--data-dir", "{root}"], "nor a folder of --data-dir"),
    ],
)
def test_dataset_mistakes_name_the_flag_before_importing_anything_heavy(uci_fixture, args, text):
    """The split, the data folder, the training-set size and the dataset name are checked with the
    standard library, in the user's words (the flag, not the API argument), before torch loads."""
    args = [a.format(root=uci_fixture.root) for a in args]
    proc = run_cli(args, python_flags=("-X", "importtime"))
    assert proc.returncode == 2 and text in proc.stderr, proc.stderr[-2000:]
    modules = imported_modules(proc)
    assert "lazykern.cli" in modules or "lazykern" in modules, "importtime output was not parsed"
    assert not {m.split(".")[0] for m in modules} & set(HEAVY), sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_version_is_the_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"lazykern {lazykern.__version__}\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["uci", "nosuchdata"], "unknown UCI dataset 'nosuchdata'"),
        (["uci", "pol", "--split", "10"], "argument --split: expected one of the 10 standard splits, 0-9, got '10'"),
        (["uci", "pol", "--n-train", "99999"], "exceeds the 360 training points"),
        (["uci", "pol", "--kernel", "nosuchkernel"], "invalid choice: 'nosuchkernel'"),
        (["uci", "pol", "--iters", "0"], "expected an integer >= 1, got '0'"),
        (["uci", "pol", "--lr", "-1"], "expected a positive number"),
        (["uci", "pol", "--json", "/nonexistent/folder/out.json"], "folder /nonexistent/folder does not exist"),
        (["uci", "pol", "--max-degree", "0"], "argument --max-degree: expected an integer >= 1, got '0'"),
        (["uci", "pol", "--kernel", "rbf-ard", "--max-degree", "2"],
         "--max-degree applies to --kernel additive-ng or oak only, not 'rbf-ard'"),
        (["uci", "pol", "--max-degree", "27"], "--max-degree 27 exceeds the 26 input dimensions of pol"),
        (["uci", "pol", "--optimizer", "sgd"], "argument --optimizer: invalid choice: 'sgd'"),
        (["uci", "pol", "--kernel", "dpa-rbf", "--projections", "0"],
         "argument --projections: expected an integer >= 1, got '0'"),
        (["uci", "pol", "--kernel", "rbf-ard", "--projections", "4"],
         "--projections applies to --kernel dpa-matern52, dpa-rbf, dpa-matern52-learned, rpa-matern52, rpa-rbf only, not 'rbf-ard'"),
        (["uci", "pol", "--projections", "4"],
         "--projections applies to --kernel dpa-matern52, dpa-rbf, dpa-matern52-learned, rpa-matern52, rpa-rbf only, not 'additive-ng'"),
        (["uci", "pol", "--tolerance", "0"], "argument --tolerance: expected a positive number, got '0'"),
        (["uci", "pol", "--warm-start", "0"], "argument --warm-start: expected an integer >= 1, got '0'"),
        (["uci", "pol", "--noise-floor", "0"],
         "argument --noise-floor: expected a positive number, 'ard' or 'none', got '0'"),
        (["uci", "pol", "--warm-start", "300", "--max-cholesky", "200"],
         "--warm-start 300 exceeds --max-cholesky 200: the subset's fit is exact; use at most that many points"),
        (["uci", "pol", "--lr", "nan"], "argument --lr: expected a positive number"),
        (["uci", "pol", "--kernel", "gpytorch-rbf-ard", "--plot", "c.png"],
         "--plot needs a kernel with additive components (additive-rbf, additive-matern52, additive-ng, oak), "
         "not 'gpytorch-rbf-ard'"),
        (["uci", "pol", "--plot", "/nonexistent/folder/c.png"], "--plot /nonexistent/folder/c.png: folder "
         "/nonexistent/folder does not exist"),
        (["uci", "pol", "--plot", "components.txt"], "unknown image format '.txt'; use one of .png, .pdf"),
        (["uci"], "the following arguments are required: dataset"),
        (["precompile", "--kernel", "gpytorch-rbf-ard"], "argument --kernel: invalid choice: 'gpytorch-rbf-ard'"),
        (["precompile", "--dims", "0"], "argument --dims: expected an integer >= 1, got '0'"),
        (["precompile", "--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
        (["precompile", "--dataset", "nosuchdata"], "--dataset nosuchdata: unknown UCI dataset 'nosuchdata'"),
        ([], "the following arguments are required: COMMAND"),
        (["fly"], "invalid choice: 'fly'"),
    ],
)
def test_usage_errors_are_one_line(uci_fixture, monkeypatch, capsys, args, message):
    monkeypatch.setenv("LAZYKERN_DATA", str(uci_fixture.root))
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("lazykern: error: "), captured.err
    assert message in captured.err and captured.out == ""


def test_missing_data_folder_says_how_to_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAZYKERN_DATA", str(tmp_path))
    assert main(["uci", "pol"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lacks data.csv.gz" in err and "LAZYKERN_DATA" in err
    assert main(["uci", "pol", "--data-dir", str(tmp_path / "absent")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["uci", "nosuchdata"], ["uci", "pol", "--dtype", "float16"]])
def test_usage_errors_exit_2_without_traceback(uci_fixture, args):
    proc = run_cli(args, {"LAZYKERN_DATA": str(uci_fixture.root)}, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("lazykern: error: ")


def test_uci_downloads_once_with_progress(uci_mirror, tmp_path, monkeypatch, capsys):
    server, _ = uci_mirror
    monkeypatch.delenv("LAZYKERN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("LAZYKERN_UCI_URL", server.url)
    assert main(["uci", "yacht", "--iters", "2"]) == 0
    captured = capsys.readouterr()
    assert f"downloading {server.url}/yacht/data.csv.gz" in captured.err
    assert "yacht split 0" in captured.out and "test RMSE" in captured.out
    assert (tmp_path / "cache" / "lazykern" / "uci" / "yacht" / "test_mask.csv.gz").is_file()
    assert main(["uci", "yacht", "--iters", "2"]) == 0
    assert len(server.requests) == 2 and "downloading" not in capsys.readouterr().err


def test_offline_download_is_one_line_pointing_at_the_demo(tmp_path, monkeypatch, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("LAZYKERN_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("LAZYKERN_UCI_URL", f"http://127.0.0.1:{port}")
    assert main(["uci", "pol", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not download" in err and "'lazykern demo' needs no data" in err


def test_every_public_name_resolves_on_first_use():
    """The package imports lazily (so the command parses first); every exported name still resolves, and
    ``lazykern.precompile`` is the function, also once its module (``lazykern.warmup``) is imported."""
    import importlib

    importlib.import_module("lazykern.warmup")
    assert callable(lazykern.precompile) and lazykern.precompile.__module__ == "lazykern.warmup"
    for name in lazykern.__all__:
        assert getattr(lazykern, name) is not None, name
    assert set(lazykern.__all__) <= set(dir(lazykern))
    with pytest.raises(AttributeError, match="no attribute 'nosuchname'"):
        lazykern.nosuchname


def test_training_defaults_are_fit_evaluates():
    """The parser answers before lazykern.regression is imported, so it repeats the recipes' defaults:
    the standard plan's are fit_evaluate's, the large-N recipe's are regression.LARGE_N's."""
    import inspect

    from lazykern import regression
    from lazykern.cli import parser as cli_parser
    from lazykern.cli.plan import plan

    defaults = {k: p.default for k, p in inspect.signature(regression.fit_evaluate).parameters.items()}
    for command in (["demo"], ["uci", "pol"]):
        job = plan(cli_parser.build_parser().parse_args(command), on_cpu=True, available=500, num_dims=3)
        assert job.kernel == defaults["kernel"] == kernel_names.DEFAULT_KERNEL and not job.full_set
        for name in ("iters", "lr", "optimizer", "tolerance"):
            assert getattr(job.recipe, name) == defaults[name], name
    large = regression.LARGE_N
    assert (cli_parser.LARGE_N_ITERS, cli_parser.LARGE_N_LR, cli_parser.LARGE_N_WARM_START,
            cli_parser.LARGE_N_WARM_START_ITERS) == (large.iters, large.lr, large.warm_start_size, large.warm_start_iters)
    assert cli_parser.CHOLESKY_MAX == large.max_cholesky_size
    choices = {a.dest: a.choices for a in cli_parser.build_parser()._subparsers._group_actions[0].choices["demo"]._actions}
    assert tuple(choices["optimizer"]) == regression.OPTIMIZERS and tuple(choices["kernel"]) == regression.KERNELS


TINY_DEMO = ["demo", "--n-train", "200", "--n-test", "50", "--quiet"]  # under 512 points: the torch engine


@pytest.mark.parametrize("flags, dtypes", [([], ["float32", "float64"]), (["--max-cholesky", "100"], ["float32"]),
                                           (["--dtype", "float64"], ["float64"])])
def test_the_warm_up_compiles_the_dtypes_training_runs(flags, dtypes, monkeypatch):
    """A float32 model trained by L-BFGS is refined in float64: the warm-up compiles both, so training
    compiles nothing unannounced; Adam (the CG path, above --max-cholesky) stays in float32."""
    import torch

    from lazykern import warmup
    from lazykern.cli import train
    from lazykern.cli.parser import build_parser
    from lazykern.warmup import PrecompileReport

    seen = []

    def precompile(kernel, dtype, **_):
        seen.append(str(dtype).removeprefix("torch."))
        return PrecompileReport("", 0, 1, 0.0)

    monkeypatch.setattr(warmup, "precompile", precompile)
    args = build_parser().parse_args(["demo", *flags])
    data = type("Data", (), {"d": 3, "n_train": 200})()
    recipe = train.plan(args, True, data.n_train, data.d).recipe
    train._warm_up("additive-rbf", None, None, data, torch.device("cpu"), getattr(torch, args.dtype), args, recipe)
    assert seen == dtypes


def test_a_converged_float32_run_says_where_it_went_on_in_float64(capsys):
    assert main([*TINY_DEMO, "--kernel", "rbf-ard", "--json", "-"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert (record["converged"], record["dtype"], record["computed_dtype"]) == (True, "float32", "float64")
    assert 0 < record["float64_from"] < record["iterations"] and record["tolerance"] == 1e-6
    assert (f"{record['iterations']} of at most 200 iterations (float64 after iteration {record['float64_from']}), "
            f"{record['evaluations']} loss evaluations, tolerance 1e-06; converged") in captured.err


def test_the_noise_floor_reaches_the_model_and_the_report(capsys):
    assert main([*TINY_DEMO, "--kernel", "rbf-ard", "--iters", "20", "--noise-floor", "0.2", "--json", "-"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["noise_floor"] == 0.2 and record["hyperparameters"]["likelihood.noise_covar.noise"] >= 0.2
    assert "noise at least 0.2)" in captured.err


def test_the_ard_noise_floor_is_measured_and_reported(capsys):
    assert main([*TINY_DEMO, "--kernel", "rbf-ard", "--iters", "20", "--noise-floor", "ard", "--json", "-"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["noise_floor"] > 0 and record["hyperparameters"]["likelihood.noise_covar.noise"] >= record["noise_floor"]
    assert f"noise at least {record['noise_floor']:.3g})" in captured.err


def test_learned_projections_take_the_ard_noise_floor_unless_told_none(capsys):
    flags = [*TINY_DEMO, "--kernel", "dpa-matern52-learned", "--projections", "4", "--iters", "5", "--json", "-"]
    assert main(flags) == 0
    floored = json.loads(capsys.readouterr().out)
    noise = floored["hyperparameters"]["likelihood.noise_covar.noise"]
    assert floored["noise_floor"] > 0 and noise >= floored["noise_floor"]
    assert main([*flags, "--noise-floor", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["noise_floor"] is None


def test_iterations_running_out_is_reported_and_warned(capsys):
    assert main([*TINY_DEMO, "--kernel", "rbf-ard", "--iters", "3", "--json", "-"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert (record["converged"], record["stop_reason"], record["iterations"]) == (False, "iteration limit", 3)
    assert record["interventions"] == [] and record["computed_dtype"] == "float32"
    assert "3 of at most 3 iterations" in captured.err and "NOT converged (iteration limit)" in captured.err
    assert ("warning: training of rbf-ard stopped (iteration limit) before it converged; its results are not the "
            "optimum's: raise --iters (now 3)") in captured.err


def test_oak_with_max_degree_reports_order_shares_and_plots(tmp_path, capsys):
    plot, out = tmp_path / "components.png", tmp_path / "out.json"
    assert main([*TINY_DEMO, "--kernel", "oak", "--max-degree", "2", "--iters", "5", "--plot", str(plot),
                 "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert (record["kernel"], record["max_degree"], record["analysis_kind"]) == ("oak", 2, "sobol")
    assert len(record["order_shares"]) == 2 and abs(sum(record["order_shares"]) - 1) < 1e-5
    assert len(record["dimension_shares"]) == 6
    first, second = record["order_shares"]
    assert re.search(rf"^order shares\s+1: {first:.3f}  2: {second:.3f}$", stdout, re.M), stdout
    assert "(Sobol indices of the posterior mean under the input measure" in stdout
    # Inputs ranked by total effect (every order), OAK's in closed form, printed with its definition.
    assert record["total_effects_kind"] == "sobol" and len(record["total_effects"]) == 6
    top = max(range(6), key=lambda k: record["total_effects"][k])
    assert re.search(rf"^top inputs\s+x{top}: {record['total_effects'][top]:.3f}  x", stdout, re.M), stdout
    assert re.search(rf"^first-order shares\s+x{top}: {record['dimension_shares'][top]:.3f}  x", stdout, re.M)
    assert "its total Sobol index; closed form under the input measure" in stdout
    assert (record["optimizer_used"], record["iters"]) == ("lbfgs", 5)
    assert (f"(L-BFGS (auto): {record['iterations']} of at most 5 iterations, {record['evaluations']} loss "
            f"evaluations, tolerance 1e-06; ") in stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {plot}" in stdout


@pytest.mark.parametrize("kernel, flags, count", [("dpa-matern52", ["--projections", "4"], 4), ("rpa-rbf", [], 12)])
def test_projected_kernels_train_and_report_each_projections_share(uci_fixture, monkeypatch, capsys, kernel, flags,
                                                                    count):
    """J from --projections, else two per input (yacht's 6 inputs: 12); one share per projection."""
    monkeypatch.setenv("LAZYKERN_DATA", str(uci_fixture.root))
    assert main(["uci", "yacht", "--kernel", kernel, *flags, "--iters", "3", "--quiet", "--json", "-"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert (record["kernel"], record["num_projections"], record["d"]) == (kernel, count, 6)
    assert record["component_axes"] == "projections" and record["total_effects_kind"] == "first-order"
    assert len(record["dimension_shares"]) == count and record["order_shares"] == [1.0]
    assert "top projections     p" in captured.err and f"the projection w_j^T x of the j-th direction, {count} of them" in captured.err
    assert len(record["hyperparameters"]["covar_module.base_kernel.component_scales"]) == count


@pytest.mark.parametrize(
    "flags, used, training",
    [
        (["--optimizer", "adam", "--lr", "0.05", "--tolerance", "0.001"], "adam", "Adam: 3 steps of at most 3"),
        (["--max-cholesky", "100"], "adam", "Adam (auto): 3 steps of at most 3"),  # CG path: auto picks Adam
        (["--optimizer", "lbfgs", "--lr", "0.5"], "lbfgs", "L-BFGS: "),
    ],
)
def test_optimizer_flags_reach_the_recipe_and_the_report(flags, used, training, capsys):
    assert main([*TINY_DEMO, "--kernel", "rbf-ard", "--iters", "3", *flags, "--json", "-"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    requested = dict(zip(flags[::2], flags[1::2]))
    assert record["optimizer"] == requested.get("--optimizer", "auto") and record["optimizer_used"] == used
    assert record["lr"] == (float(requested["--lr"]) if "--lr" in requested else None)
    assert record["tolerance"] == float(requested.get("--tolerance", kernel_names.TOLERANCES[used]))
    assert record["solver"] == ("cg" if "--max-cholesky" in requested else "cholesky")
    assert record["evaluations"] == 3 if used == "adam" else 1 <= record["evaluations"] <= 6
    assert training in captured.err
    # A kernel without components: no shares in the record or the report.
    assert record["order_shares"] is None and record["analysis_kind"] is None and "order shares" not in captured.err


PRECOMPILE_LINE = r"\[(\d)/(\d)\] {} d=3 float64: (\d+) compiled, (\d+) cached, [\d.]+ s"


def precompile_counts(stderr: str, kernel: str) -> tuple[int, int]:
    """(compiled, cached) from ``lazykern precompile``'s progress line of ``kernel``."""
    found = re.search(PRECOMPILE_LINE.format(re.escape(kernel)), stderr)
    assert found, stderr[-2000:]
    return int(found.group(3)), int(found.group(4))


@pytest.mark.slow
def test_precompile_compiles_once_then_reads_the_cache(tmp_path):
    from lazykern.native import CACHE_ENV as CPU_CACHE_ENV
    from lazykern.keops import CACHE_ENV

    env = {CACHE_ENV: str(tmp_path), CPU_CACHE_ENV: str(tmp_path / "cpu")}
    command = ["precompile", "--kernel", "additive-rbf", "--dims", "3", "--dtype", "float64"]
    first = run_cli(command, env)
    assert first.returncode == 0, first.stderr[-2000:]
    compiled, cached = precompile_counts(first.stderr, "additive-rbf")
    assert compiled > 0 and cached == 0
    summary = first.stdout.strip()
    assert summary.count("\n") == 0 and f"{compiled} programs compiled, 0 found cached" in summary
    assert re.search(rf"cache folder {re.escape(str(tmp_path))}\S*$", summary), summary
    assert "[KeOps]" not in first.stdout + first.stderr

    second = run_cli(command, env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert precompile_counts(second.stderr, "additive-rbf") == (0, compiled)

    # Two configurations in two processes: one cached, one new; --quiet keeps the summary only.
    both = run_cli([*command, "--kernel", "rbf-ard", "--jobs", "2"], env)
    assert both.returncode == 0, both.stderr[-2000:]
    assert precompile_counts(both.stderr, "additive-rbf") == (0, compiled)
    assert precompile_counts(both.stderr, "rbf-ard")[0] > 0
    assert "2 of 2 kernel configurations (additive-rbf, rbf-ard; d = 3; float64; cpu)" in both.stdout
    quiet = run_cli([*command, "--kernel", "rbf-ard", "--jobs", "2", "--quiet"], env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-2000:]
    assert "0 programs compiled" in quiet.stdout


@pytest.mark.slow
def test_first_run_says_it_compiles_then_stays_quiet(tmp_path):
    from lazykern.native import CACHE_ENV as CPU_CACHE_ENV
    from lazykern.keops import CACHE_ENV

    env = {CACHE_ENV: str(tmp_path), CPU_CACHE_ENV: str(tmp_path / "cpu")}
    command = ["demo", "--kernel", "additive-rbf", "--d", "3", "--dtype", "float64", "--n-train", "50",
               "--n-test", "10", "--iters", "2"]
    first = run_cli(command, env)
    assert first.returncode == 0, first.stderr[-2000:]
    note = re.search(r"compiling the additive-rbf reductions for first use: (.*); cached in (\S+)\n", first.stderr)
    assert note and "about 1 s each with lazykern's CPU engine" in note.group(1), first.stderr[-2000:]
    assert note.group(2).startswith(str(tmp_path))
    done = re.search(r"compiled (\d+) additive-rbf reductions in [\d.]+ s", first.stderr)
    assert done and int(done.group(1)) > 0
    assert first.stderr.index(note.group(0)) < first.stderr.index(done.group(0))
    assert "compil" not in first.stdout and "test RMSE" in first.stdout  # the report alone

    again = run_cli([*command, "--verbose"], env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "compiling" not in again.stderr and "additive-rbf: reductions cached" in again.stderr
    quiet = run_cli([*command, "--quiet"], env)
    assert quiet.returncode == 0 and "reductions" not in quiet.stderr


def test_precompile_reads_a_datasets_dimensions(uci_fixture):
    from lazykern.cli.parser import UsageError
    from lazykern.cli.precompile import _dataset_dims

    assert _dataset_dims("yacht", uci_fixture.root, progress=False) == 6
    assert _dataset_dims("pol", uci_fixture.root, progress=False) == 26
    with pytest.raises(UsageError, match="--dataset elevators: .* lacks data.csv.gz"):
        _dataset_dims("elevators", uci_fixture.root, progress=False)


def test_precompile_names_a_damaged_dataset_in_one_line(tmp_path):
    """A deflate stream damaged in its first block raised zlib.error, which the command did not catch."""
    import gzip

    from lazykern.cli.parser import UsageError
    from lazykern.cli.precompile import _dataset_dims

    folder = tmp_path / "yacht"
    folder.mkdir()
    damaged = bytearray(gzip.compress(b"1,2,3\n" * 5000))
    damaged[12:30] = b"\xff" * 18
    (folder / "data.csv.gz").write_bytes(bytes(damaged))
    (folder / "test_mask.csv.gz").write_bytes(gzip.compress(b"0\n"))
    with pytest.raises(UsageError, match=r"--dataset yacht: .*data.csv.gz: is damaged \(Error -3"):
        _dataset_dims("yacht", tmp_path, progress=False)


def test_report_reads_metrics_worse_than_the_mean_predictor():
    """One line per metric on which a model does no better than the mean predictor (yacht --compare
    printed an NLPD of 2.25 against the mean predictor's 1.46 without a word)."""
    from lazykern.cli.report import _readings

    mean = {"rmse": 1.0, "nlpd": 1.46}
    assert _readings({"kernel": "k", "rmse": 0.5, "nlpd": 0.2}, mean) == []
    (line,) = _readings({"kernel": "k", "rmse": 0.5, "nlpd": 2.25}, mean)
    assert line.startswith("reading: k's test NLPD 2.2500 is worse than the mean predictor's 1.4600")
    assert "over-confident" in line
    rmse, nlpd = _readings({"kernel": "k", "rmse": 1.2, "nlpd": 2.25}, mean)
    assert "RMSE 1.2000 is no better than the mean predictor's 1.0000" in rmse
    assert "worse than the training mean" in nlpd


def test_the_warm_start_has_its_own_budget(monkeypatch, capsys):
    """``--warm-start-iters`` is the subset fit's own L-BFGS budget in the command's recipe (default:
    ``--iters``), and asks for ``--warm-start``."""
    from lazykern.regression import steps

    budgets, warm_start = [], steps.warm_start
    monkeypatch.setattr(steps, "warm_start",
                        lambda *args, iters, **kwargs: budgets.append(iters) or warm_start(*args, iters=iters, **kwargs))
    flags = [*TINY_DEMO, "--kernel", "rbf-ard", "--iters", "3", "--warm-start", "100", "--json", "-"]
    assert main(flags) == 0
    assert json.loads(capsys.readouterr().out)["warm_start_size"] == 100
    assert main([*flags, "--warm-start-iters", "2"]) == 0
    assert budgets == [3, 2]
    capsys.readouterr()
    assert main([*TINY_DEMO, "--warm-start-iters", "2"]) == 2
    assert "lazykern: error: --warm-start-iters applies with --warm-start M only" in capsys.readouterr().err
