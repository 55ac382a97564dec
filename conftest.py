"""Root pytest configuration, for the doctests of ``lazykern/`` and ``docs/`` (tests/ has its own).

GPyTorch imports pykeops, which prints a notice on first import (e.g. no CUDA); importing them
here, before any example runs, keeps that notice out of the examples' expected output.
"""

import gpytorch  # noqa: F401
