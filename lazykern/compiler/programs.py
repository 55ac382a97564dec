r"""The programs a target has built in this process, each built once.

A target (:mod:`lazykern.native` for C, :mod:`lazykern.triton.build`) keeps one :class:`Programs`
table by :class:`~lazykern.compiler.plan.Reduction` (or by source text). Reads take no lock; a
miss takes the table's lock and checks again, so threads asking for the same program at once wait
for one build instead of each compiling it.

Example:
    >>> from lazykern.compiler.programs import Programs
    >>> table = Programs()
    >>> table.get("double", lambda: 2.0 * 21), table.get("double", lambda: 0.0), len(table)
    (42.0, 42.0, 1)
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, TypeVar

__all__ = ["Programs"]

T = TypeVar("T")


class Programs:
    """Built programs by key; :meth:`get` builds a missing one once, under a lock."""

    def __init__(self) -> None:
        # Each key's builder decides its program's type: the table holds whatever they built.
        self._built: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The program of ``key``, from ``build()`` the first time it is asked for."""
        program = self._built.get(key)
        if program is None:
            with self._lock:
                program = self._built.get(key)
                if program is None:
                    program = self._built[key] = build()
        return program

    def __len__(self) -> int:
        return len(self._built)
