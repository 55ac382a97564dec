"""The text speaks to its readers: what is true now and how it was measured, never how the work was organised.

Scanned: the README, the changelog, the docs' pages, the benchmarks' results pages and the records they
are rendered from, and the text of every Python file of lazykern, the tests, the docs, the benchmarks and
the examples (its comments and strings: docstrings, messages, printed text; names in code are not text)
and of the benchmarks' shell scripts. Flagged: sentences about sessions of work ("this session", "the
session's time"), this project's issue numbers ("issue #25", "(#26)", "Issue 9, item 13", "the issue
asks") and the development machine's time limits ("to fit a 3-hour session", "device time").

The code's and the field's own words stay: identifiers such as ``keops_session`` and pytest's
``scope="session"``, KeOps' "compile session", and other projects' issues named with their project
("GPyTorch #748", "pykeops issue 123", ``owner/repo#123``, a GitHub ``/issues/123`` address).
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("README.md", "CHANGELOG.md", "docs/**/*.rst", "docs/**/*.py", "lazykern/**/*.py", "tests/**/*.py",
           "benchmarks/**/*.py", "benchmarks/**/*.sh", "benchmarks/**/*.md", "benchmarks/**/*.rst",
           "benchmarks/**/*.json", "benchmarks/**/*.jsonl", "examples/**/*.py")
#: Build output and caches are not the project's text; this file quotes the flagged phrases as examples.
SKIPPED_PARTS = {"_build", "__pycache__", ".pytest_cache", "output"}
SELF = Path(__file__).resolve()

#: Projects whose issue numbers are the field's words: written right before the number ("GPyTorch #748",
#: "KeOps' issue 123") or right after it ("issue #123 of pykeops").
PROJECTS = (r"GPyTorch|linear[_ ]operator|KeOps|pykeops|keopscore|PyTorch|torch|Triton|NumPy|SciPy|"
            r"scikit-learn|sklearn|pytest|pytest-xdist|CPython|Python|matplotlib|tqdm|psutil|glibc|CUDA|NVRTC")
#: The code's and the field's words, left alone wherever a flag below would otherwise match them.
ALLOWED = re.compile(
    rf"\b(?:{PROJECTS})(?:'s?)?\s+(?:issues?\s*)?#?\d+"              # GPyTorch #748, pykeops issue 123
    rf"|\bissues?\s*#?\d+\s+(?:of|in|on)\s+(?:the\s+)?(?:{PROJECTS})\b"  # issue #123 of pykeops
    r"|[\w.-]+/[\w.-]+#\d+"                                             # cornellius-gp/gpytorch#748
    r"|[\"']sessions?[\"']"                                            # pytest's scope="session"
    r"|\bcompile sessions?\b"                                          # KeOps' compile session
    r"|(?<=[./])sessions?\b|\bsessions?\.py\b"                          # a module: lazykern.keops.session
    r"|``[^`]*\bsessions?\b[^`]*``",                                    # an inline literal: ``session=...``
    re.I)

#: (what the text speaks of, pattern). Identifiers such as ``keops_session`` never match ``\bsession``
#: (the underscore is a word character).
FLAGS = (
    ("a session of work", re.compile(r"\bsessions?\b", re.I)),
    ("this project's issue number",
     re.compile(r"\b(?:issues?|PR|pull request|ticket)(?:\s+#?|\s*#)\d+|(?<![\w&/])#\d{1,4}\b", re.I)),
    ("this project's issue",
     re.compile(r"\b(?:this|the) issue(?:'s|\s+(?:asks|says|names|wants|requires))"
                r"|\b(?:this|the)\s+(?!same\b|known\b|real\b|underlying\b|main\b)[a-z]+\s+issue\b(?!s)"
                r"|\bdone[- ]when\b|\bwhat to build\b", re.I)),
    ("the development machine's time limits",
     re.compile(r"\b\d+[- ]hours?\s+(?:session|limit|budget|cap|window)"
                r"|\b(?:session|machine|device|sandbox)'s\s+(?:time|hours|minutes|limit)"
                r"|\bdevice time\b|\bran out of time\b"
                r"|\btime limits? of the (?:development|dev|build) machine", re.I)),
)


def findings(text: str) -> list[tuple[str, str]]:
    """(what it speaks of, the words) for every flagged phrase of ``text`` outside the allowed words."""
    allowed = [m.span() for m in ALLOWED.finditer(text)]
    return [(why, m.group(0)) for why, pattern in FLAGS for m in pattern.finditer(text)
            if not any(start <= m.start() < end for start, end in allowed)]


def text_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a file's prose: a Python file's comments and strings, any other file whole."""
    source = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".py":
        return list(enumerate(source.splitlines(), 1))
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(token.start[0] + i, line) for token in tokens if token.type in (tokenize.COMMENT, tokenize.STRING)
            for i, line in enumerate(token.string.splitlines())]


def scanned_files() -> list[Path]:
    files = {path.resolve() for glob in SCANNED for path in ROOT.glob(glob) if path.is_file()}
    return sorted(p for p in files if p != SELF and not SKIPPED_PARTS & set(p.relative_to(ROOT).parts))


@pytest.mark.parametrize("text", [
    "cut after 140 of its 200 steps by the session's time",
    "80 Adam steps, not 200, to fit a 3-hour session",
    "No GPU was available to this session, so the throughput is an assumption",
    "the other rows are from the first run of the same session",
    "The GPU run of issue #25: lazykern's GPU engines against GPyTorch's KeOps kernels",
    "Goal (issue 12): the default within 2x",
    "answered in one line naming the flag (#26)",
    "Issue 9, item 13: batch operations",
    "Memory at N = 1024: the issue asks for at most a third",
    "Against the goals of the performance issue, same run:",
    "the run used 9 minutes of device time",
])
def test_flags_text_about_how_the_work_was_organised(text):
    assert findings(text), text


@pytest.mark.parametrize("text", [
    '@pytest.fixture(scope="session")',
    "with keops_session():  # the mark rides in the reduction's options",
    "lazykern.keops: KeOps' LazyTensor reductions, with lazykern's compile session",
    "GPyTorch #748 describes the same failure",
    "a known bug (pykeops issue 123, KeOps' issue #45)",
    "see issue #123 of pykeops",
    "cornellius-gp/gpytorch#748",
    "https://github.com/getkeops/keops/issues/123",
    "returned with converged=False and a RuntimeWarning is issued; cg issues a warning",
    "each part in its own process under a hard time limit",
    "a dense matrix formed when it fits the device's budget",
    "the hooks live in :mod:`lazykern.keops.session` (keops/session.py); ``session.depth`` counts entries",
    "colour #1f77b4, line 12, 3 hours of training",
])
def test_leaves_the_code_and_the_fields_own_words(text):
    assert not findings(text), findings(text)


def test_no_sentence_speaks_of_how_the_work_was_organised():
    files = scanned_files()
    assert len(files) > 100 and ROOT / "README.md" in files, "the scan found the project's text"
    hits = [f"{path.relative_to(ROOT)}:{number}: {why}: {words!r}"
            for path in files
            for number, line in text_lines(path)
            for why, words in findings(line)]
    assert not hits, "say what is true now and how it was measured:\n" + "\n".join(hits)


def test_readme_how_long_is_a_few_rows_of_todays_figures():
    """Each row of the README's "How long" table: one command, its time now, and the machine and date it
    was measured on; how the figures changed belongs to CHANGELOG.md, not to the table."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("**How long.**"):]
    table = re.search(r"^\|.*?(?=^\s*$)", section, re.M | re.S).group(0).splitlines()
    header, rule, rows = table[0], table[1], table[2:]
    assert header.split("|")[-2].strip() == "measured on" and set(rule) <= set("|-: "), table[:2]
    assert 1 <= len(rows) <= 6, rows
    for row in rows:
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", row.split("|")[-2]), f"machine and date: {row}"
        assert not re.search(r"\b(?:before|earlier|was|were|used to)\b", row, re.I), f"history: {row}"
    assert (ROOT / "CHANGELOG.md").is_file()
