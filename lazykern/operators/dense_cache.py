"""The dense tensors lazykern keeps for reuse, within one budget per device: kernel matrices of
:class:`~lazykern.operators.LazyKernelOperator` and the per-layer features of
:class:`~lazykern.ntk.NTKOperator`.

Operators are rebuilt from their tensors by ``linear_operator`` (inside ``Matmul``,
``InvQuadLogdet``, ...), so a cache on an operator object would be lost after every call. Entries
are therefore keyed on an *owner* object that outlives the rebuilt operators, held weakly (its
entries die with it): the row inputs ``x1`` of a kernel matrix, or the feature family of one
:func:`~lazykern.ntk.empirical_ntk` call. Each entry is checked against the identity and version
of every tensor it was formed from and a key (the formula); an owner keeps one entry per *slot*
(kernel matrices: one per ``x1``; NTK features: one per input tensor, parameters and batch element).

All entries share :class:`lazykern.settings.max_dense_bytes` per device
(:meth:`DenseCache.budget`): storing evicts the least recently used entries on the device, of
either kind, until the total fits.

One lock guards every read and write, so operators used from several threads share the cache
safely; the tensors themselves are formed outside the lock.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Hashable

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from .. import settings

__all__ = ["DenseCache", "DENSE_CACHE"]


@dataclass
class _Entry:
    others: tuple[weakref.ref, ...]
    key: tuple
    value: Any
    nbytes: int
    device: torch.device
    last_used: int

    def alive(self) -> bool:
        return all(ref() is not None for ref in self.others)


class DenseCache:
    """Dense tensors (kernel matrices, NTK features), at most
    :class:`lazykern.settings.max_dense_bytes` in total per device.

    Storing evicts the least recently used entries on the value's device until the total fits the
    budget; a value that cannot fit is not stored.

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
        >>> x.add_(1) is x and cache.lookup(x, (x,), "formula") is None  # modified in place: stale
        True
    """

    def __init__(self) -> None:
        self._entries: Any = WeakIdKeyDictionary()  # owner -> {slot: _Entry}
        self._lock = threading.Lock()
        self._clock = itertools.count()

    @staticmethod
    def _key(owner: Any, others: tuple[Tensor, ...], key: Hashable) -> tuple:
        # an in-place change (an optimizer step on a parameter) bumps a tensor's version counter
        return (key, tuple(t._version for t in (owner, *others) if isinstance(t, Tensor)))

    def lookup(self, owner: Any, others: tuple[Tensor, ...], key: Hashable, slot: Hashable = None) -> Any:
        """The value stored in ``slot`` of ``owner`` for these exact tensors (same objects,
        unmodified since) and ``key``; ``None`` if there is none.

        Args:
            owner: the object the entry belongs to (held weakly), e.g. a kernel matrix's ``x1``.
            others: the other tensors the value was formed from.
            key: what else it depends on (hashable, e.g. the formula).
            slot: which of ``owner``'s entries.
        """
        wanted = self._key(owner, others, key)
        with self._lock:
            entry = self._entries.get(owner, {}).get(slot)
            if entry is None or entry.key != wanted or len(entry.others) != len(others):
                return None
            if not all(ref() is t for ref, t in zip(entry.others, others)):
                return None
            entry.last_used = next(self._clock)
            return entry.value

    def count(self, owner: Any) -> int:
        """How many entries ``owner`` has (formed from tensors that are all still alive)."""
        with self._lock:
            return sum(e.alive() for e in self._entries.get(owner, {}).values())

    def held(self, device: torch.device) -> int:
        """Bytes currently held on ``device``."""
        with self._lock:
            return sum(e.nbytes for e in self._on(device))

    def _on(self, device: torch.device) -> list[_Entry]:
        return [e for slots in list(self._entries.values()) for e in slots.values() if e.device == device]

    def budget(self, device: torch.device) -> int:
        """The dense budget of ``device`` now: :meth:`lazykern.settings.max_dense_bytes.for_device`
        with what this cache holds there (the one budget rule of every dense tensor lazykern keeps)."""
        return settings.max_dense_bytes.for_device(device, held=self.held(device))

    def fits(self, nbytes: int, device: torch.device) -> bool:
        """Whether a value of ``nbytes`` may be formed on ``device`` under the current budget."""
        return nbytes <= self.budget(device)

    def store(
        self,
        owner: Any,
        others: tuple[Tensor, ...],
        key: Hashable,
        value: Any,
        slot: Hashable = None,
        *,
        nbytes: int | None = None,
        device: torch.device | None = None,
    ) -> bool:
        """Keep ``value`` in ``slot`` of ``owner`` (replacing what was there), evicting least
        recently used entries on its device until the total fits the budget. Returns whether it
        was stored.

        Args:
            owner, others, key, slot: as for :meth:`lookup`.
            value: a tensor, or anything else with ``nbytes`` and ``device`` given.
            nbytes: bytes ``value`` holds (default: a tensor's).
            device: where ``value`` lives (default: a tensor's).
        """
        if nbytes is None:
            nbytes = value.numel() * value.element_size()
        device = value.device if device is None else device
        budget = self.budget(device)
        entry = _Entry(tuple(weakref.ref(t) for t in others), self._key(owner, others, key), value, nbytes, device, 0)
        with self._lock:
            slots = self._entries.get(owner)
            if slots is not None:
                slots.pop(slot, None)
            if nbytes > budget:
                return False
            candidates = []
            for o, entries in list(self._entries.items()):
                for s, e in list(entries.items()):
                    if not e.alive():  # formed from a tensor that died: can never match again
                        del entries[s]
                    elif e.device == device:
                        candidates.append((e.last_used, o, s, e))
            total = sum(e.nbytes for *_, e in candidates)
            for _, o, s, e in sorted(candidates, key=lambda c: c[0]):
                if total + nbytes <= budget:
                    break
                del self._entries[o][s]
                total -= e.nbytes
            entry.last_used = next(self._clock)
            if slots is None:
                slots = self._entries[owner] = {}
            slots[slot] = entry
            return True

    def clear(self) -> None:
        """Drop every stored value."""
        with self._lock:
            self._entries.clear()


#: The process-wide cache of lazykern's operators (kernel matrices and NTK features).
DENSE_CACHE = DenseCache()
