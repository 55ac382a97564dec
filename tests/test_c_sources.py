"""lazykern's C: where it lives, that it compiles without warnings, and that its libraries follow it.

Hand-written C lives in ``.c`` and ``.h`` files next to the modules that load them, and every
program includes ``lazykern.h`` (:data:`lazykern.native.INCLUDE_FOLDER`). Each file, and the
generated reductions of passes that between them hold every operation of lazykern's compiler,
compile with ``-Wall -Werror`` under the engine's own command line (:func:`lazykern.native.command`).
No Python string literal of lazykern holds more than 10 lines of C written out (code generation
writes lines that substitute names and values: those are templates, not hand-written C). A change
of a program's header compiles it again instead of loading the library of the old one.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

import lazykern
from lazykern import native
from lazykern.compiler.plan import program
from lazykern.compiler.programs import Programs
from lazykern.cpu.codegen import generate
from lazykern.formulas import StationaryFormula

from .test_compiler_ops import FORMULAS, reductions

ROOT = pathlib.Path(lazykern.__file__).parent
needs_compiler = pytest.mark.skipif(native.compiler() is None, reason="needs a C compiler ($CXX, else g++)")

#: The ``#define`` lines each file is compiled with by the module that loads it (a file not listed:
#: none). A new file that needs some fails to compile here until it is listed.
DEFINES = {"cpu/dense_matmul.c": [{"LK_REAL": "float"}, {"LK_REAL": "double"}]}


def hand_written() -> list[tuple[str, str, tuple[str, ...]]]:
    """``(name, source, include folders)`` of every hand-written C program as its module compiles it
    (:func:`lazykern.native.load_file`: the file's own folder after lazykern.h's)."""
    found = []
    for path in sorted(ROOT.rglob("*.c")):
        name = path.relative_to(ROOT).as_posix()
        for defines in DEFINES.get(name, [{}]):
            text = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + path.read_text()
            found.append((f"{name} {defines}", text, (native.INCLUDE_FOLDER, str(path.parent))))
    return found


def generated() -> list[tuple[str, str, tuple[str, ...]]]:
    """``(name, source, include folders)`` of generated reductions: every job of the passes that hold
    every operation of the compiler's table (tests/test_compiler_ops.py), and float32 passes."""
    reds = list(reductions())
    for formula, widths in FORMULAS[:1] + [(StationaryFormula("rbf"), {})]:
        for job in ("mm", "gradA"):
            want = () if job == "mm" else ("x", *widths)
            reds.append(program(formula, job, 3, 3, tuple(widths.items()), "float", want))
    return [(f"generated {red.dtype} pass {k}", generate(red), (native.INCLUDE_FOLDER,)) for k, red in enumerate(reds)]


def complaints(source: str, include: tuple[str, ...], src: pathlib.Path) -> str:
    """What the compiler says (empty when it succeeds) about ``source``, written to ``src``, under
    the engine's flags and ``-Wall -Werror``."""
    src.write_text(source)
    cmd = native.command(str(src), str(src.with_suffix(".so")), f"{native.engine_flags()} -Wall -Werror", include)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return "" if proc.returncode == 0 else f"{' '.join(cmd)}\n{proc.stderr[-3000:]}"


@needs_compiler
@pytest.mark.slow
def test_every_c_source_compiles_without_warnings(tmp_path):
    programs = hand_written() + generated()
    assert len(hand_written()) >= 5
    assert [name for name, text, _ in programs if '#include "lazykern.h"' not in text] == []
    with ThreadPoolExecutor(max_workers=2) as pool:
        said = pool.map(lambda k: complaints(programs[k][1], programs[k][2], tmp_path / f"program{k}.c"),
                        range(len(programs)))
        found = {programs[k][0]: text for k, text in enumerate(said) if text}
    assert found == {}


def _c_lines(text: str) -> int:
    """Lines of ``text`` that are C: statements, braces and preprocessor directives, written out
    (a line that holds a substituted value, ``\\0`` here, is a template's)."""
    count = 0
    for line in text.splitlines():
        line = line.strip()
        if "\0" in line:
            continue
        if line.endswith((";", "{", "}")) or line.startswith(("#include", "#define", "#pragma", "#if", "#endif")):
            count += 1
    return count


def c_in_strings(source: str) -> list[tuple[int, int]]:
    """``(line, C lines)`` of every string literal of the Python ``source`` with more than 10 lines
    of C written out (f-strings: their literal parts, each substitution a template line's mark)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) else "\0" for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if _c_lines(text) > 10 and "{" in text and ";" in text:
            found.append((node.lineno, _c_lines(text)))
    return found


def test_no_c_source_in_python_strings():
    found = {path.relative_to(ROOT).as_posix(): hits for path in sorted(ROOT.rglob("*.py"))
             if (hits := c_in_strings(path.read_text()))}
    assert found == {}, "C of more than 10 lines belongs in a .c or .h file next to its module"


def test_the_detector_finds_c_in_a_string_and_passes_templates():
    c_file = (ROOT / "structured" / "additive.c").read_text()
    assert c_in_strings(f"SOURCE = r'''{c_file}'''\n") == [(1, _c_lines(c_file))]
    assert c_in_strings(f"SOURCE = r'''{c_file}''' % {{}}\n")  # formatted later: still C in a string
    template = "\n".join(f"    x{{k}}[{k}] = {{value}};" for k in range(20))
    assert c_in_strings(f"def emit(k, value):\n    return f'''{{{{\n{template}\n}}}}'''\n") == []


@needs_compiler
def test_a_changed_header_compiles_again(tmp_path, monkeypatch):
    """The library of a program is keyed by its source and its headers', lazykern.h's included:
    after a header changes, a new process (a fresh table of programs here) compiles again."""
    import ctypes

    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    common, own = tmp_path / "common", tmp_path / "own"
    common.mkdir(), own.mkdir()
    monkeypatch.setattr(native, "INCLUDE_FOLDER", str(common))
    source = own / "probe.c"
    source.write_text('#include "lazykern.h"\n#include "probe.h"\nvoid lk_probe(double *x) { x[0] = COMMON + OWN; }\n')

    def value(common_value: int, own_value: int) -> float:
        (common / "lazykern.h").write_text(f"#define COMMON {common_value}\n")
        (own / "probe.h").write_text(f"#define OWN {own_value}\n")
        monkeypatch.setattr(native, "_programs", Programs())
        x = (ctypes.c_double * 1)()
        native.load_file(str(source), "lk_probe", [ctypes.c_void_p])(x)
        return x[0]

    before = len(native.compile_log)
    assert (value(1, 10), value(1, 10), value(2, 10), value(2, 20)) == (11.0, 11.0, 12.0, 22.0)
    assert len(native.compile_log) - before == 3
