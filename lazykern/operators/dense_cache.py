"""The dense kernel matrices lazykern keeps for reuse, within one budget per device.

Kernel operators are rebuilt from their tensors by ``linear_operator`` (inside ``Matmul``,
``InvQuadLogdet``, ...), so a cache on an operator object would be lost after every call. Entries
are therefore keyed on the tensors themselves: the row inputs ``x1`` (by identity, dropped when
``x1`` dies), checked against the identity and version of every other input and the formula.

One lock guards every read and write, so operators used from several threads share the cache
safely; the matrices themselves are built outside the lock.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from .. import settings

__all__ = ["DenseCache", "DENSE_CACHE"]


@dataclass
class _Entry:
    others: tuple[weakref.ref, ...]
    key: tuple
    dense: Tensor
    last_used: int

    @property
    def nbytes(self) -> int:
        return self.dense.numel() * self.dense.element_size()


class DenseCache:
    """Dense kernel matrices, at most :class:`lazykern.settings.max_dense_bytes` in total per device.

    Storing a matrix evicts the least recently used ones on its device until the total fits the
    budget; a matrix that cannot fit is not stored.

    Example:
        >>> import torch
        >>> cache = DenseCache()
        >>> x = torch.randn(4, 2)
        >>> cache.lookup(x, (x,), "formula") is None
        True
        >>> with settings.max_dense_bytes(1000):
        ...     cache.store(x, (x,), "formula", torch.ones(4, 4))
        True
        >>> cache.lookup(x, (x,), "formula").shape, cache.held(x.device)
        (torch.Size([4, 4]), 64)
    """

    def __init__(self) -> None:
        self._entries: Any = WeakIdKeyDictionary()
        self._lock = threading.Lock()
        self._clock = itertools.count()

    @staticmethod
    def _key(x1: Tensor, others: tuple[Tensor, ...], formula: Any) -> tuple:
        return (formula, tuple(t._version for t in (x1, *others)))

    def lookup(self, x1: Tensor, others: tuple[Tensor, ...], formula: Any) -> Tensor | None:
        """The matrix stored for these exact tensors (same objects, unmodified) and formula."""
        key = self._key(x1, others, formula)
        with self._lock:
            entry = self._entries.get(x1)
            if entry is None or entry.key != key or len(entry.others) != len(others):
                return None
            if not all(ref() is t for ref, t in zip(entry.others, others)):
                return None
            entry.last_used = next(self._clock)
            return entry.dense

    def held(self, device: torch.device) -> int:
        """Bytes currently held on ``device``."""
        with self._lock:
            return self._held(device)

    def _held(self, device: torch.device) -> int:
        return sum(e.nbytes for e in list(self._entries.values()) if e.dense.device == device)

    def budget(self, device: torch.device) -> int:
        """The dense budget of ``device`` now (see :class:`lazykern.settings.max_dense_bytes`)."""
        return settings.max_dense_bytes.for_device(device, held=self.held(device))

    def fits(self, nbytes: int, device: torch.device) -> bool:
        """Whether a matrix of ``nbytes`` may be formed on ``device`` under the current budget."""
        return nbytes <= self.budget(device)

    def store(self, x1: Tensor, others: tuple[Tensor, ...], formula: Any, dense: Tensor) -> bool:
        """Keep ``dense`` for these tensors, evicting least recently used matrices on its device
        until the total fits the budget. Returns whether it was stored."""
        device = dense.device
        budget = self.budget(device)
        entry = _Entry(tuple(weakref.ref(t) for t in others), self._key(x1, others, formula), dense, 0)
        with self._lock:
            self._entries.pop(x1, None)
            if entry.nbytes > budget:
                return False
            on_device = sorted(
                ((k, e) for k, e in list(self._entries.items()) if e.dense.device == device),
                key=lambda item: item[1].last_used,
            )
            total = sum(e.nbytes for _, e in on_device)
            for k, e in on_device:
                if total + entry.nbytes <= budget:
                    break
                self._entries.pop(k, None)
                total -= e.nbytes
            entry.last_used = next(self._clock)
            self._entries[x1] = entry
            return True

    def clear(self) -> None:
        """Drop every stored matrix."""
        with self._lock:
            self._entries.clear()


#: The process-wide cache of :class:`~lazykern.operators.LazyKernelOperator`.
DENSE_CACHE = DenseCache()
