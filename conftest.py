"""Root pytest configuration, for every test (tests/ adds its own) and the doctests of ``lazykern/`` and ``docs/``.

GPyTorch imports pykeops, which prints a notice on first import (e.g. no CUDA). Importing them here,
once per process (pytest's and each xdist worker's) with that notice discarded, keeps it out of the
examples' expected output and off the terminal (a worker's stdout would reach it after the summary).
Subprocesses the tests start import them on their own.
"""

import contextlib
import os

with open(os.devnull, "w") as _sink, contextlib.redirect_stdout(_sink):
    import gpytorch  # noqa: F401

import pytest  # noqa: E402
from gpytorch import settings as _gp_settings  # noqa: E402
from linear_operator import settings as _linop_settings  # noqa: E402

#: The linear_operator and GPyTorch defaults that importing BoTorch replaces with its own, for the
#: whole process (``botorch/__init__.py``: Cholesky up to 4,096 points, no fast solves). Collecting
#: the BoTorch tests imports it into every worker, so each test runs under the defaults of the
#: library it tests: BoTorch's where BoTorch is the subject, GPyTorch's everywhere else.
_BOTORCH_CHANGES = [
    (_linop_settings._fast_covar_root_decomposition, "_default"),
    (_linop_settings._fast_log_prob, "_default"),
    (_linop_settings._fast_solves, "_default"),
    (_linop_settings.cholesky_max_tries, "_global_value"),
    (_linop_settings.max_cholesky_size, "_global_value"),
    (_gp_settings.max_eager_kernel_size, "_global_value"),
]
_GPYTORCH_DEFAULTS = [getattr(setting, attr) for setting, attr in _BOTORCH_CHANGES]
try:
    import botorch  # noqa: F401, E402  (now, so that no later import changes them mid-run)

    _BOTORCH_DEFAULTS = [getattr(setting, attr) for setting, attr in _BOTORCH_CHANGES]
except ImportError:
    _BOTORCH_DEFAULTS = _GPYTORCH_DEFAULTS


@pytest.fixture(autouse=True)
def _library_defaults(request):
    """BoTorch's defaults for BoTorch's tests (a file named for it, or a module of ``lazykern.botorch``),
    GPyTorch's for every other one."""
    path = str(getattr(request.node, "path", ""))
    named = "botorch" in os.path.basename(path) or os.path.basename(os.path.dirname(path)) == "botorch"
    values = _BOTORCH_DEFAULTS if named else _GPYTORCH_DEFAULTS
    for (setting, attr), value in zip(_BOTORCH_CHANGES, values):
        setattr(setting, attr, value)
    yield
