r"""One progress line for a whole training job, with an estimate of the time left.

A job runs phases one after another — fits of a subset, the steps on all points, the final solve,
the variance check — each with a budget of units (iterations, steps). :class:`JobProgress` shows
one line on stderr: the phase, its units done of its budget, the time so far, and the time left,
estimated from what has been measured only:

.. math::

    t_\text{left} = (b_p - u_p)\, r_p + \sum_{q > p} b_q\, \hat r_q,

where :math:`b` are the budgets, :math:`u_p` the units done in the current phase, :math:`r_p` its
measured seconds per unit and :math:`\hat r_q` a later phase's: measured by the phase its cost is
given in units of (``like=``), or unknown — then the line says so rather than guess. Budgets are
limits (an optimizer may converge earlier), so the estimate is an upper bound where every rate is
measured.

Example:
    >>> progress = JobProgress([("fit", 3), ("solve", 1)], enabled=False)
    >>> with progress.phase("fit") as bar:
    ...     bar.update(3)
    >>> progress.phase_of("solve").budget, progress.done("fit")
    (1, 3)
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Iterator

__all__ = ["JobProgress", "Phase", "PhaseBar", "in_phase", "progress_bar"]


@dataclass
class Phase:
    """One phase of a job: its name, budget of units, and how long a unit took.

    Attributes:
        name: what the line calls it.
        budget: most units it runs.
        like: the phase whose seconds per unit this one's are estimated by until it runs (its
            units being worth one of that phase's), or ``None``.
        units: units done.
        seconds: wall-clock seconds spent in it.
    """

    name: str
    budget: int
    like: str | None = None
    units: int = 0
    seconds: float = 0.0
    started: float | None = field(default=None, repr=False)

    def rate(self) -> float | None:
        """Measured seconds per unit, ``None`` before its first unit."""
        return self.seconds / self.units if self.units else None


class PhaseBar:
    """What a training loop updates (``update``, ``set_postfix``, ``n``, like tqdm's bar), counting
    the units of one phase of a :class:`JobProgress`."""

    def __init__(self, progress: JobProgress, phase: Phase) -> None:
        self.progress, self.phase = progress, phase

    @property
    def n(self) -> int:
        return self.phase.units

    def update(self, n: int = 1) -> None:
        self.phase.units = min(self.phase.budget, self.phase.units + n)
        self.progress.render()

    def set_postfix(self, **values: str) -> None:
        self.progress.postfix = ", ".join(f"{k} {v}" for k, v in values.items())


class JobProgress:
    """The progress line of a job of named phases (see the module docstring).

    Args:
        phases: ``(name, budget)`` or ``(name, budget, like)`` per phase, in the order they run.
        enabled: show the line (else only count).
        file: where the line goes.
        every: least seconds between two renderings.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> progress = JobProgress([("steps", 10), ("solve", 2, "steps")], file=out, every=0)
        >>> with progress.phase("steps") as bar:
        ...     bar.update(5)
        >>> "steps 5/10" in out.getvalue()
        True
    """

    def __init__(self, phases: list[tuple], *, enabled: bool = True, file: IO[str] | None = None,
                 every: float = 0.5) -> None:
        self.phases = {p[0]: Phase(*p) for p in phases}
        self.enabled, self.file, self.every = enabled, file or sys.stderr, every
        self.start, self.current, self.postfix = time.perf_counter(), None, ""
        self._shown, self._width = -float("inf"), 0

    def phase_of(self, name: str) -> Phase:
        return self.phases[name]

    def done(self, name: str) -> int:
        return self.phases[name].units

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[PhaseBar]:
        """Run phase ``name``: its bar counts units, its seconds are measured; a phase that ends
        before its budget (converged) leaves nothing of it to the estimate."""
        phase = self.phases[name]
        self.current, self.postfix, phase.started = phase, "", time.perf_counter()
        try:
            yield PhaseBar(self, phase)
        finally:
            phase.seconds += time.perf_counter() - phase.started
            phase.started = None
            phase.budget = max(phase.units, 1)
            phase.units = phase.budget
            self.render(force=True)

    def left(self) -> float | None:
        """Seconds left (see the module docstring), ``None`` while a phase's cost is unknown."""
        total, now = 0.0, time.perf_counter()
        for phase in self.phases.values():
            if phase.units >= phase.budget and phase.started is None:
                continue
            seconds = phase.seconds + (now - phase.started if phase.started else 0.0)
            rate = seconds / phase.units if phase.units else None
            if rate is None and phase.like is not None:
                rate = self.phases[phase.like].rate()
            if rate is None:
                return None
            total += (phase.budget - phase.units) * rate
        return total

    def render(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self._shown < self.every) or self.current is None:
            return
        self._shown = now
        left = self.left()
        phase = self.current
        line = (f"{phase.name} {phase.units}/{phase.budget}" + (f" ({self.postfix})" if self.postfix else "")
                + f" | {_clock(now - self.start)} so far | "
                + ("time left not known yet" if left is None else f"at most {_clock(left)} left"))
        self.file.write("\r" + line.ljust(self._width))
        self.file.flush()
        self._width = len(line)

    def close(self) -> None:
        """Clear the line (the report follows on a clean line)."""
        if self.enabled and self._width:
            self.file.write("\r" + " " * self._width + "\r")
            self.file.flush()

    def __enter__(self) -> JobProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds + 0.5), 60)
    return f"{minutes}:{seconds:02d}"


@contextlib.contextmanager
def in_phase(progress: object, name: str) -> Iterator[None]:
    """Phase ``name`` of ``progress`` where it is a :class:`JobProgress` that plans one; else nothing.

    Example:
        >>> job = JobProgress([("fit", 2)], enabled=False)
        >>> with in_phase(job, "fit"), in_phase(job, "solve"), in_phase(True, "fit"):
        ...     job.current.name
        'fit'
    """
    if isinstance(progress, JobProgress) and name in progress.phases:
        with progress.phase(name):
            yield
    else:
        yield


@contextlib.contextmanager
def progress_bar(progress: bool | JobProgress, total: int, desc: str, phase: str | None = None) -> Iterator:
    """A bar for a loop of ``total`` units: tqdm's (``progress`` true), a silent one (false), or the
    current phase of a :class:`JobProgress` (``phase``, or the one it is running).

    Example:
        >>> job = JobProgress([("training", 5)], enabled=False)
        >>> with progress_bar(job, 5, "training", phase="training") as bar:
        ...     bar.update(2)
        >>> job.done("training")   # the phase ended: what it ran is all it costs
        2
    """
    if isinstance(progress, JobProgress) and (phase is not None or progress.current is not None):
        if phase is None:
            yield PhaseBar(progress, progress.current)
        else:
            with progress.phase(phase) as bar:
                yield bar
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, disable=not progress or isinstance(progress, JobProgress), leave=False) as bar:
        yield bar
