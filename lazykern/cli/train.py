"""``lazykern uci`` and ``lazykern demo``: load the data, compile each kernel's reductions (saying
so when that takes a while), train and evaluate it by :func:`lazykern.regression.fit_evaluate`,
then write the report, the component plot and the JSON record. torch and the rest are imported
once the options have been checked."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, TextIO

from ..kernel_names import COMPARE_KERNELS, GPYTORCH_KERNELS
from .checks import check_kernel_flags, check_options, json_to_stdout
from .parser import COMPILE_TIMES, CPU_DEFAULT_N_TRAIN, DEMO_CPU_N_TRAIN, DEMO_GPU_N_TRAIN, UsageError
from .plan import job_progress, plan
from .report import comparison_text, results_text, training_notes
from .runtime import resolve_device

if TYPE_CHECKING:  # imported with torch, once the options have been checked
    from ..regression import Recipe

__all__ = ["run"]


def _load(args: argparse.Namespace, device, dtype):
    """The data split, the :class:`~lazykern.cli.plan.Plan` for it and a sentence saying how many
    training points were used and why."""
    from ..data import DownloadError, load_uci, synthetic_additive

    on_cpu = device.type == "cpu"
    if args.command == "demo":
        if args.n_train is not None:
            n, why = args.n_train, "--n-train"
        elif on_cpu:
            n, why = DEMO_CPU_N_TRAIN, "CPU default; --n-train N to change"
        else:
            n, why = DEMO_GPU_N_TRAIN, "GPU default; --n-train N to change"
        data = synthetic_additive(n, args.n_test, args.d, seed=args.seed, dtype=dtype, device=device)
        return data, plan(args, on_cpu, data.n_train, data.d), f"n_train={n} synthetic points ({why})"
    kwargs = dict(split=args.split, seed=args.seed, dtype=dtype, device=device, data_dir=args.data_dir,
                  progress=not args.quiet)
    try:
        if args.n_train is not None:
            data = load_uci(args.dataset, n_train=args.n_train, **kwargs)
            return data, plan(args, on_cpu, data.n_train, data.d), f"n_train={args.n_train} (--n-train)"
        data = load_uci(args.dataset, **kwargs)
        job = plan(args, on_cpu, data.n_train, data.d)
        if job.full_set:
            return data, job, (f"n_train={data.n_train}: all training points (the large-N recipe for {job.kernel} "
                               "on a CPU; --n-train N to subsample)")
        if on_cpu and data.n_train > CPU_DEFAULT_N_TRAIN:
            note = (f"n_train={CPU_DEFAULT_N_TRAIN}: a random subset of the {data.n_train} training points "
                    "(CPU default; --n-train N to change)")
            return load_uci(args.dataset, n_train=CPU_DEFAULT_N_TRAIN, **kwargs), job, note
        return data, job, f"n_train={data.n_train}: all training points"
    except DownloadError as err:
        raise UsageError(f"{err}; 'lazykern demo' needs no data") from None
    except (ValueError, TypeError, OSError) as err:
        raise UsageError(str(err)) from None


def _warm_up(kernel: str, max_degree: int | None, num_projections: int | None, data, device, dtype,
             args: argparse.Namespace, recipe: Recipe) -> None:
    """Compile ``kernel``'s reductions before training, saying so on stderr when that takes a while."""
    import gpytorch
    import torch

    from ..regression import make_kernel, refines_in_float64, resolve_optimizer
    from ..warmup import precompile

    announced = []

    def announce(folder: str) -> None:
        if not announced:
            announced.append(folder)
            print(f"compiling the {kernel} reductions for first use: {COMPILE_TIMES}; cached in {folder}",
                  file=sys.stderr, flush=True)

    # A float32 model that L-BFGS trains is refined in float64 (lazykern.regression.train): both dtypes run.
    with gpytorch.settings.max_cholesky_size(recipe.max_cholesky_size):
        refined = refines_in_float64(dtype, resolve_optimizer(recipe.optimizer, data.n_train))
    module = make_kernel(kernel, data.d, max_degree, num_projections).to(device)  # precompile converts a copy of it
    reports = [precompile(module, dtype=t, dims=data.d, points=data.n_train, on_compile=None if args.quiet else announce)
               for t in ((dtype, torch.float64) if refined else (dtype,))]
    compiled, cached, seconds = (sum(getattr(r, k) for r in reports) for k in ("compiled", "cached", "seconds"))
    if args.quiet:
        return
    if compiled:
        print(f"compiled {compiled} {kernel} reductions in {seconds:.1f} s", file=sys.stderr, flush=True)
    elif args.verbose:
        print(f"{kernel}: reductions cached ({cached} loaded in {seconds:.1f} s)", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``lazykern uci`` or ``lazykern demo``: load the data, train and evaluate ``--kernel`` (and
    ``--compare``'s kernels) with the flags' :class:`~lazykern.regression.Recipe`, write the report
    to ``out`` (stderr with ``--json -``) and the plot and JSON where asked.

    Args:
        args: the parsed command line (:func:`~lazykern.cli.parser.build_parser`).
        out: where the report (or, with ``--json -``, the record) goes.

    Returns:
        the exit status, 0.

    Raises:
        UsageError: a mistake in the command found before training (one line).
    """
    check_options(args)  # before torch is imported: a mistake is answered at once

    import torch

    from ..components import plot_components
    from ..regression import NoiseFloor, fit_evaluate, gaussian_metrics

    report = sys.stderr if json_to_stdout(args.json) else out
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    data, job, note = _load(args, device, dtype)
    check_kernel_flags(args, job.kernel)
    recipe = job.recipe
    if args.warm_start_iters is not None and recipe.warm_start_size is None:
        raise UsageError("--warm-start-iters applies with --warm-start M only")
    if args.compare and job.full_set:
        raise UsageError(f"--compare trains ARD kernels, whose products cost O(N^2): not on all {data.n_train} "
                         f"training points; add --n-train N (e.g. {CPU_DEFAULT_N_TRAIN}) to compare on a subset")
    if args.max_degree is not None and args.max_degree > data.d:
        raise UsageError(f"--max-degree {args.max_degree} exceeds the {data.d} input dimensions of {data.name}; "
                         f"use at most {data.d}")
    print(f"{data.name} split {data.split}: {note}; n_test={data.n_test}, d={data.d}, "
          f"{args.dtype} on {device}", file=report, flush=True)
    kernels = [job.kernel] + ([k for k in COMPARE_KERNELS if k != job.kernel] if args.compare else [])
    results = []
    for i, kernel in enumerate(kernels):
        if len(kernels) > 1 and not args.quiet:
            print(f"[{i + 1}/{len(kernels)}] {kernel}", file=sys.stderr, flush=True)
        max_degree, num_projections = (args.max_degree, job.num_projections) if i == 0 else (None, None)
        if kernel not in GPYTORCH_KERNELS:
            _warm_up(kernel, max_degree, num_projections, data, device, dtype, args, recipe)
        torch.manual_seed(args.seed)
        own = recipe if i == 0 else replace(recipe, noise_floor=NoiseFloor(None))
        with job_progress(own, kernel, data.n_train, enabled=not args.quiet) as progress:
            results.append(fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel=kernel,
                                        max_degree=max_degree, num_projections=num_projections, recipe=own,
                                        y_scale=data.y_std, progress=progress))
    # The training mean and variance are 0 and 1 in standardized units, by construction.
    rmse, nlpd = gaussian_metrics(torch.zeros_like(data.test_y), torch.ones_like(data.test_y), data.test_y)
    mean_predictor = {"rmse": rmse, "nlpd": nlpd, "rmse_original": rmse * data.y_std,
                      "nlpd_original": nlpd + math.log(data.y_std)}
    record = {"dataset": data.name, "split": data.split, "seed": args.seed, **results[0].to_dict(),
              "mean_predictor": mean_predictor}
    if args.compare:
        record["compare"] = [r.to_dict() for r in results[1:]]
    print(results_text(record), file=report)
    print("\n" + comparison_text(record), file=report, flush=True)
    for note in (line for result in results for line in training_notes(result.to_dict())):
        print(note, file=sys.stderr, flush=True)
    if args.plot is not None:
        plot_components(results[0].analysis, args.plot, x_mean=data.x_mean, x_std=data.x_std, y_mean=data.y_mean,
                        y_std=data.y_std, title=f"{data.name} split {data.split}: {job.kernel}")
        print(f"wrote {args.plot}", file=report)
    if json_to_stdout(args.json):
        print(json.dumps(record, indent=2), file=out, flush=True)
    elif args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}", file=report)
    return 0
