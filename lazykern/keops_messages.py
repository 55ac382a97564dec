"""KeOps' messages on stderr, where a library's warnings belong, not on a program's stdout.

keopscore prints its messages (``[KeOps] Warning : CUDA libraries not found ...`` when it is
imported, which GPyTorch does on ``import gpytorch.kernels``; compile notices later) with
``print`` to stdout, where they mix into a program's output (a script's results, ``--json -``).
:func:`install` registers an import hook that, once ``keopscore.utils.misc_utils`` (the module of
``KeOps_Print``, ``KeOps_Message`` and ``KeOps_Warning``) has run, gives that module a ``print``
that writes to stderr. Nothing of KeOps is imported here, and nothing is silenced: ``KEOPS_VERBOSE=0``
still silences KeOps.

Example:
    >>> import subprocess, sys
    >>> code = "import lazykern, gpytorch.kernels"
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    ''
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
from typing import Iterator

__all__ = ["install", "silenced"]

_MODULE = "keopscore.utils.misc_utils"


_sink = None  # where the messages go instead of stderr, inside `silenced`


def _print_to_stderr(*args, **kwargs) -> None:
    # sys.stderr looked up at each call: test runners replace it.
    kwargs.setdefault("file", sys.stderr if _sink is None else _sink)
    print(*args, **kwargs)


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """KeOps' messages go nowhere inside this block (``lazykern``'s commands without ``--verbose``).

    Example:
        >>> from lazykern import keops_messages
        >>> with keops_messages.silenced():
        ...     pass
    """
    global _sink
    previous = _sink
    with open(os.devnull, "w") as sink:
        _sink = sink
        try:
            yield
        finally:
            _sink = previous


class _StderrLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):  # noqa: D102 - importlib protocol
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: D102 - importlib protocol
        self.loader.exec_module(module)
        module.print = _print_to_stderr


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: D102 - importlib protocol
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _StderrLoader(spec.loader)
        return spec


def install() -> None:
    """Route KeOps' messages to stderr from its first import on (once; where KeOps is already
    imported, its module is patched in place)."""
    loaded = sys.modules.get(_MODULE)
    if loaded is not None:
        loaded.print = _print_to_stderr
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
