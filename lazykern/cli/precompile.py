"""``lazykern precompile``: compile the reductions of the command's kernels, for the given input
dimensions and dtypes, into the cache that later runs read; several configurations at once in
separate processes (``--jobs``)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from .parser import COMPILE_TIMES, LAZYKERN_KERNELS, PRECOMPILE_DIMS, UsageError
from .runtime import library_output, resolve_device

__all__ = ["run"]


def _dataset_dims(name: str, data_dir: Path | None, progress: bool) -> int:
    """The number of inputs of a UCI dataset, from the first row of its data (inputs, then the target)."""
    from ..data import locate_uci
    from ..data.checks import first_row

    try:
        path = locate_uci(name, data_dir, progress=progress) / "data.csv.gz"
        columns = first_row(path).count(",") + 1
    except (ValueError, TypeError, OSError) as err:  # DownloadError is an OSError, DataError a ValueError
        raise UsageError(f"--dataset {name}: {err}") from None
    if columns < 2:
        raise UsageError(f"--dataset {name}: {path} has one column; expected inputs and a target")
    return columns - 1


def _precompile_one(kernel: str, dims: int, dtype: str, device: str, verbose: bool) -> dict[str, Any]:
    """One configuration of ``lazykern precompile`` (a function of plain values: it may run in a worker process)."""
    with library_output(verbose):  # in a worker process too: KeOps prints when it is imported
        import torch

        from ..warmup import precompile
        from ..regression import make_kernel

        report = precompile(make_kernel(kernel, dims).to(device), dtype=getattr(torch, dtype), dims=dims)
    return report._asdict()


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``lazykern precompile``: compile every (kernel, input dimensions, dtype) configuration the
    flags name, in ``--jobs`` processes, one line each on stderr and a summary on ``out``.

    Args:
        args: the parsed command line (:func:`~lazykern.cli.parser.build_parser`).
        out: where the summary goes.

    Returns:
        the exit status: 0, or 1 when a configuration failed (said on stderr).
    """
    kernels = list(dict.fromkeys(args.kernel or LAZYKERN_KERNELS))
    dtypes = list(dict.fromkeys(args.dtype or ["float32", "float64"]))
    dims = list(args.dims or [])
    for name in args.dataset or []:
        dims.append(_dataset_dims(name, args.data_dir, progress=not args.quiet))
    dims = list(dict.fromkeys(dims or PRECOMPILE_DIMS))
    device = str(resolve_device(args.device))
    if not args.quiet and (args.verbose or device.startswith("cuda")):  # which engine, and why (GPU: its health check)
        from ..backend import engine_report

        print(engine_report(device), file=sys.stderr, flush=True)
    items = [(k, d, t) for k in kernels for d in dims for t in dtypes]
    jobs = min(args.jobs, len(items))
    if not args.quiet:
        print(f"precompiling {len(items)} kernel configurations for {device}"
              f"{f' in {jobs} processes' if jobs > 1 else ''}; a reduction not cached yet takes {COMPILE_TIMES}",
              file=sys.stderr, flush=True)
    start = time.perf_counter()
    compiled = cached = 0
    failed: list[str] = []
    folders: set[str] = set()

    def done(n: int, item: tuple[str, int, str], result: dict[str, Any] | None, error: BaseException | None) -> None:
        nonlocal compiled, cached
        what = f"{item[0]} d={item[1]} {item[2]}"
        if error is not None:
            failed.append(what)
            print(f"[{n}/{len(items)}] {what}: failed: {error}", file=sys.stderr, flush=True)
            return
        compiled += result["compiled"]
        cached += result["cached"]
        folders.add(result["folder"])
        if not args.quiet:
            print(f"[{n}/{len(items)}] {what}: {result['compiled']} compiled, {result['cached']} cached, "
                  f"{result['seconds']:.1f} s", file=sys.stderr, flush=True)

    if jobs == 1:
        for n, item in enumerate(items, start=1):
            try:
                done(n, item, _precompile_one(*item, device, args.verbose), None)
            except Exception as err:  # noqa: BLE001 - one configuration's failure is reported, the rest go on
                done(n, item, None, err)
    else:
        import concurrent.futures
        import multiprocessing

        # Separate processes compile in parallel (g++ runs one core each); the cache's file locks keep
        # two of them from compiling one program at once. "spawn": nothing of this process is copied.
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_precompile_one, *item, device, args.verbose): item for item in items}
            for n, future in enumerate(concurrent.futures.as_completed(futures), start=1):
                error = future.exception()
                done(n, futures[future], None if error else future.result(), error)
    where = os.path.commonpath(sorted(folders)) if folders else "(nothing compiled)"
    print(f"precompiled {len(items) - len(failed)} of {len(items)} kernel configurations "
          f"({', '.join(kernels)}; d = {', '.join(map(str, dims))}; {', '.join(dtypes)}; {device}) "
          f"in {time.perf_counter() - start:.1f} s: {compiled} programs compiled, {cached} found cached; "
          f"cache folder {where}", file=out, flush=True)
    if failed:
        print(f"lazykern: error: precompiling failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
