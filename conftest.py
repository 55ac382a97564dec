"""Root pytest configuration, for the doctests of ``lazykern/`` and ``docs/`` (tests/ has its own).

GPyTorch imports pykeops, which prints a notice on first import (e.g. no CUDA). Importing them here,
once per process (pytest's and each xdist worker's) with that notice discarded, keeps it out of the
examples' expected output and off the terminal (a worker's stdout would reach it after the summary).
Subprocesses the tests start import them on their own.
"""

import contextlib
import os

with open(os.devnull, "w") as _sink, contextlib.redirect_stdout(_sink):
    import gpytorch  # noqa: F401
