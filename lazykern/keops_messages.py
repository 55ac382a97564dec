"""KeOps' messages on stderr, where a library's notices belong, never on a program's stdout.

keopscore prints its messages with ``print`` to stdout: its CUDA status when it is imported
(``[KeOps] Warning : CUDA libraries not found ... Switching to CPU only``, which GPyTorch triggers
on ``import gpytorch.kernels`` on every CPU-only machine) and a notice whenever it compiles. On
stdout they mix into a program's output (a script's results, ``lazykern uci --json -``); on stderr
the import-time status would still make every one-line error message of a script two lines, for
a fact the user did not ask about (which engine runs, and why, is what ``lazykern precompile`` and
``--verbose`` report). So, from :func:`install` on (``import lazykern`` calls it):

* the messages keopscore prints while it is being imported are dropped, unless inside
  :func:`verbose`;
* every other message goes to stderr (nowhere inside :func:`silenced`).

An import hook gives ``keopscore.utils.misc_utils`` (the module of ``KeOps_Print``,
``KeOps_Message`` and ``KeOps_Warning``) a ``print`` of its own once it has run; nothing of KeOps
is imported here. ``KEOPS_VERBOSE=0`` still silences KeOps entirely. This is a matter of the
process, not of the KeOps engine (:mod:`lazykern.keops`): GPyTorch imports KeOps whatever engine
runs, so the hook sits below every engine, where ``import lazykern`` reaches it without importing
torch.

Example:
    >>> import subprocess, sys
    >>> code = "import lazykern, gpytorch.kernels"
    >>> out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    >>> out.stdout, "[KeOps]" in out.stderr
    ('', False)
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Iterator

__all__ = ["install", "silenced", "verbose"]

_MESSAGES = "keopscore.utils.misc_utils"
_IMPORTED = "keopscore"  # the package whose import prints its CUDA status

_sink = None  # where messages go instead of stderr (inside `silenced` and while keopscore is imported)
_verbose = False  # inside `verbose`: the import-time messages are shown too


def _print_to_stderr(*args, **kwargs) -> None:
    # sys.stderr looked up at each call: test runners and the CLI replace it.
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


@contextlib.contextmanager
def verbose() -> Iterator[None]:
    """All of KeOps' messages on stderr inside this block, its import-time CUDA status included
    (``lazykern``'s commands with ``--verbose``).

    Example:
        >>> from lazykern import keops_messages
        >>> with keops_messages.verbose():
        ...     pass
    """
    global _verbose
    previous, _verbose = _verbose, True
    try:
        yield
    finally:
        _verbose = previous


class _Loader(importlib.abc.Loader):
    def __init__(self, name: str, loader: importlib.abc.Loader) -> None:
        self.name, self.loader = name, loader

    def create_module(self, spec):  # noqa: D102 - importlib protocol
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: D102 - importlib protocol
        if self.name == _IMPORTED and not _verbose:
            with silenced():
                self.loader.exec_module(module)
        else:
            self.loader.exec_module(module)
        if self.name == _MESSAGES:
            module.print = _print_to_stderr


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: D102 - importlib protocol
        if name not in (_MESSAGES, _IMPORTED):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(name, spec.loader)
        return spec


def install() -> None:
    """Route KeOps' messages as described above from its first import on (once; where KeOps is
    already imported, its messages module is patched in place)."""
    loaded: Any = sys.modules.get(_MESSAGES)  # KeOps' module, whose print is replaced below
    if loaded is not None:
        loaded.print = _print_to_stderr
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
