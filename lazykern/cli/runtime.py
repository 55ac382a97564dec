"""What every command sets up around its work: where the libraries' own output goes (stdout
carries the command's report alone) and the device it runs on."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

from .. import keops_messages
from .parser import UsageError

__all__ = ["library_output", "resolve_device"]


@contextlib.contextmanager
def library_output(verbose: bool) -> Iterator[None]:
    """Within the block, send what KeOps and other libraries print to stderr (``verbose``) or nowhere.

    Example:
        >>> from lazykern.cli.runtime import library_output
        >>> with library_output(verbose=False):
        ...     print("a library's notice")   # not on stdout
    """
    # KeOps prints its CUDA status when it is imported and a notice whenever it compiles a formula
    # (to stderr, lazykern.keops.messages). stdout carries the command's report alone (it is read,
    # piped and parsed), so library output goes to stderr with --verbose and nowhere otherwise.
    if verbose:
        with contextlib.redirect_stdout(sys.stderr), keops_messages.verbose():
            yield
    else:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), keops_messages.silenced():
            yield


def resolve_device(choice: str):
    """The torch device of ``--device`` (``auto``: CUDA where available); CUDA asked for but absent is a
    usage error.

    Example:
        >>> from lazykern.cli.runtime import resolve_device
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    import torch

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was requested but no CUDA device is available; use --device cpu")
    return torch.device(choice)
