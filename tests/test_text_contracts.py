"""The library's docstrings and comments state contracts; measurements live in docs/ and benchmarks/results/.

A docstring says what a function computes, its arguments and shapes, an example and, in a sentence,
why it is built that way; where the reason is a measurement it points to the page that holds it
("measured: docs/performance.rst, "Chunk size""). A run's figures depend on the machine, the load and
the day, so they go stale in code, where nobody re-measures them; the docs and results pages keep
them with their context (machine, date, command).

Scanned: every docstring (module, class, function and attribute docstrings: every string that
stands alone as a statement) and every comment of every module under ``lazykern/``. Not scanned:
the code's other strings (messages and printed text report the run they are printed in), inline
math (the ``:math:`` role and ``.. math::`` blocks) and inline literals (code between double
backquotes, such as ``timeout_s=300``). Flagged:

* machine models: CPU families (Xeon, EPYC, Ryzen, Core i7, Apple M2, ...) and core counts of a
  machine ("2-core", "2 cores", "16 CPU cores");
* dates of runs: ``2026-12-05``;
* timings: a number with a unit of time ("0.19 s", "5-40 s", "12 ms", "3 seconds", "10 minutes").
  A bare ``s`` needs the space before it ("1s" reads as "ones", "2 s.d." is a standard deviation).

Allowed, as contract text: a duration that is a bound the code enforces, written as one ("5 minutes
at most", "a timeout of 300 s", "a time limit of 10 minutes"). GPU models are not flagged: they name
the hardware a behaviour belongs to (a driver's bug, a compile target), which is a contract's
business.

And functions stay short: no function of ``lazykern/`` is longer than :data:`MAX_FUNCTION_LINES`
lines, counted from its ``def`` to its last line without its docstring (the contract may be as long
as it needs). Module-level tables (the compilers' code tables) are not functions and not counted.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "lazykern"
MAX_FUNCTION_LINES = 80

_NUMBER = r"\d+(?:[.,]\d+)*"
_AMOUNT = rf"(?<![\w.^/]){_NUMBER}(?:\s*(?:-|–|to)\s*{_NUMBER})?"

#: (what the text speaks of, pattern).
FLAGS = (
    ("a machine model",
     re.compile(r"\b(?:Xeon|EPYC|Opteron|Ryzen|Threadripper|Graviton|MacBook|Core\s+i[3579]|i[3579]-\d{4,5}[A-Z]*"
                r"|Apple\s+M\d|M\d\s+(?:Pro|Max|Ultra))\b"
                r"|\b(?:\d+|dual|quad|hexa|octa)[- ](?:CPU[- ])?cores?\b|\b\d+ vCPUs?\b", re.I)),
    ("the date of a run", re.compile(r"\b20\d\d-\d\d-\d\d\b")),
    ("a timing",
     re.compile(rf"{_AMOUNT}\s*(?:ms|µs|μs|ns|secs?|seconds?|milliseconds?|microseconds?|mins?|minutes?|hours?)\b"
                rf"|{_AMOUNT} s\b(?!\.\w)")),
)
#: Durations the code enforces, stated as bounds: contract text, not a measurement.
BOUND = re.compile(rf"(?:at most|timeout of|time limit of|limit of)\s+{_AMOUNT}\s*\w+"
                   rf"|{_AMOUNT}\s*\w+\s+at most", re.I)
#: What is not prose: inline math, ``.. math::`` blocks (the directive and the blank or deeper-indented
#: lines after it) and inline literals.
NOT_PROSE = re.compile(r":math:`[^`]*`|``.*?``|^([ \t]*)\.\. math::.*(?:\n\1[ \t]+.*|\n[ \t]*(?=\n))*", re.M)


def findings(text: str) -> list[tuple[str, str, int]]:
    """(what it speaks of, the words, their offset) for every flagged phrase of the prose ``text``."""
    prose = NOT_PROSE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    bounds = [m.span() for m in BOUND.finditer(prose)]
    return [(why, m.group(0), m.start()) for why, pattern in FLAGS for m in pattern.finditer(prose)
            if not any(start <= m.start() < end for start, end in bounds)]


def prose(source: str) -> list[tuple[int, str]]:
    """(first line, text) of each docstring and comment of a Python source."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comments = [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    strings = [(node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
               and isinstance(node.value.value, str)]
    return comments + strings


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, lines without its docstring) of every function of a Python source."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0]
            doc = first.end_lineno - first.lineno + 1 if ast.get_docstring(node, clean=False) is not None else 0
            out.append((node.name, node.lineno, node.end_lineno - node.lineno + 1 - doc))
    return out


def library_sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in sorted(LIBRARY.rglob("*.py"))
            if "__pycache__" not in path.parts}


@pytest.mark.parametrize("text", [
    "Intel Xeon, one thread",
    "(AMD EPYC, 2 cores, one quiet run)",
    "which on a 2-core Xeon makes an additive RBF reduction about 3x faster",
    "on an Apple M2 Max laptop",
    "a Core i7-8700 with 16 CPU cores",
    "measured on 2026-12-05",
    "took 0.19 s compiled against 1.5 s in row blocks",
    "KeOps: 5-40 s per formula the first time",
    "float32 trained in 1,558 s",
    "the block took 12 ms",
    "a full run takes 10 minutes",
    "3 seconds a step",
])
def test_flags_measurements(text):
    assert findings(text), text


@pytest.mark.parametrize("text", [
    "timeout_s: seconds before the probe is killed",
    "a probe in a subprocess (one compile and reduction; 5 minutes at most)",
    "killed after a timeout of 300 s",
    ":math:`\\kappa - \\frac{(c \\beta)^2 a^2}{2 s}` and the terms :math:`B^2 k^2 s`",
    "Its value\n\n    .. math::\n\n        X = \\frac{a}{2 s}\n\n    after the block",
    "split 3 has no test points (1s)",
    "± 2 s.d. of the centred component",
    "each row owned by one thread; g++ runs one core each",
    "``timeout_s=300``",
    "the Triton kernel compiled for sm_90 (H200), driver 580",
    "m1 * (-0.5 * diff * diff)",
    "a compile takes about a second, once per formula",
])
def test_leaves_contract_text(text):
    assert not findings(text), findings(text)


def test_a_math_block_ends_where_its_indentation_does():
    assert findings("    .. math::\n\n        X = 2 s\n\n    took 2 s") == [("a timing", "2 s", 41)]


def test_docstrings_and_comments_hold_no_measurements():
    sources = library_sources()
    assert len(sources) > 50 and LIBRARY / "settings.py" in sources, "the scan found the library"
    hits = [f"{path.relative_to(ROOT)}:{line + text[:start].count(chr(10))}: {why}: {words!r}"
            for path, source in sources.items()
            for line, text in prose(source)
            for why, words, start in findings(text)]
    assert not hits, ("measurements belong in docs/ or benchmarks/results/ (leave a pointer to them):\n"
                      + "\n".join(hits))


def test_function_lengths_count_code_not_docstrings():
    source = 'def f(x):\n    """Doc.\n\n    More.\n    """\n    y = x\n    return y\n\n\ndef g():\n    pass\n'
    assert function_lengths(source) == [("f", 1, 3), ("g", 10, 2)]


def test_no_function_is_longer_than_80_lines():
    long = [f"{path.relative_to(ROOT)}:{line}: {name} has {length} lines"
            for path, source in library_sources().items()
            for name, line, length in function_lengths(source)
            if length > MAX_FUNCTION_LINES]
    assert not long, f"split functions longer than {MAX_FUNCTION_LINES} lines (docstring excluded):\n" + "\n".join(long)
