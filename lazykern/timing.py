"""Wall-clock seconds and peak memory of device work: what both the library's measurements (the
NTK's throughput probes, :mod:`lazykern.ntk.throughput`) and the regression job's records read.

CUDA runs its kernels asynchronously, so a clock read right after a call measures the launch, not
the work; :func:`synchronize` waits for the queue first, and :class:`Stopwatch` and
:class:`PeakMemory` do so at the end of their block. Nothing here knows of kernels or models, so
every layer above may use it.

Example:
    >>> import torch
    >>> from lazykern.timing import PeakMemory, Stopwatch
    >>> device = torch.device("cpu")
    >>> with Stopwatch(device) as clock, PeakMemory(device) as peak:
    ...     _ = torch.ones(1000, 1000) @ torch.ones(1000, 1)
    >>> clock.seconds > 0, peak.mb > 0, peak.measure
    (True, True, 'sampled_peak_rss')
"""

from __future__ import annotations

import threading
import time

import torch

__all__ = ["PeakMemory", "Stopwatch", "synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA kernels run asynchronously), so that a wall
    clock read next measures it; nothing to wait for on a CPU.

    Args:
        device: the device whose queue to drain.

    Example:
        >>> import time, torch
        >>> from lazykern.timing import synchronize
        >>> start = time.perf_counter()
        >>> _ = torch.ones(100, 100) @ torch.ones(100, 100)
        >>> synchronize(torch.device("cpu"))
        >>> time.perf_counter() - start >= 0
        True
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall-clock seconds of a block of code, the device's queued work included: the clock starts on
    entry and stops on exit once ``device`` has finished (:func:`synchronize`).

    Args:
        device: the device the block's work runs on.

    Attributes:
        seconds: the block's duration (set on exit; NaN before).

    Example:
        >>> import torch
        >>> from lazykern.timing import Stopwatch
        >>> with Stopwatch(torch.device("cpu")) as clock:
        ...     _ = torch.ones(10**5).sum()
        >>> clock.seconds >= 0
        True
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.seconds = float("nan")

    def __enter__(self) -> "Stopwatch":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._start


class PeakMemory:
    """Peak memory of a block of code, in MiB: CUDA allocations on a GPU, resident set size on a CPU.

    On CPU a background thread samples the process's resident set size (``psutil``, every
    millisecond, on every platform) while the block runs; the peak is the largest sample, so an
    allocation that lives less than a millisecond may be missed. Nothing of the process is reset.
    On CUDA the device's allocation peak is reset on entry and read on exit. The peak over two
    blocks run one after the other is the larger of their peaks.

    Args:
        device: the device whose memory to watch.

    Attributes:
        mb: the peak, in MiB (set on exit; NaN before).
        measure: what ``mb`` is, ``"cuda_max_allocated"`` or ``"sampled_peak_rss"``.

    Example:
        >>> import torch
        >>> from lazykern.timing import PeakMemory
        >>> with PeakMemory(torch.device("cpu")) as peak:
        ...     _ = torch.ones(10**6)
        >>> peak.mb > 0
        True
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.mb = float("nan")
        self.measure = "cuda_max_allocated" if self.device.type == "cuda" else "sampled_peak_rss"

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import psutil

            process = psutil.Process()
            self._peak, self._stop = process.memory_info().rss, threading.Event()

            def sample() -> None:
                while not self._stop.wait(0.001):
                    self._peak = max(self._peak, process.memory_info().rss)

            self._sampler = threading.Thread(target=sample, daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            import psutil

            self._stop.set()
            self._sampler.join()
            self.mb = max(self._peak, psutil.Process().memory_info().rss) / 2**20
