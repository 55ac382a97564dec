"""The layers of docs/architecture.rst, checked against lazykern's imports as the code writes them.

Every ``import`` and ``from ... import`` of every module is read with :mod:`ast` (function-level
imports included: a deferred import is still a dependency), resolved to the lazykern module it
names, and checked against the layer table of ``docs/architecture.rst``: each unit (a top-level
module or package of lazykern) imports only units of lower layers, so the engines (one layer) never
import each other, and no module imports itself back through a circle. The library never imports
the application wing the table marks (``# application``). The formulas import no engine library.
Then the path of one product: ``kernel(X) @ v`` asks the chooser once, and no operator module names
an engine.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest
import torch

import lazykern
from lazykern import backend, settings

ROOT = pathlib.Path(lazykern.__file__).parent
ARCHITECTURE = ROOT.parent / "docs" / "architecture.rst"
ENGINE_LIBRARIES = ("pykeops", "keopscore", "triton")


def _modules() -> dict[str, pathlib.Path]:
    """Every lazykern module by dotted name (a package by the name of its ``__init__``)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("lazykern", *path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, int]]:
    """``(imported name, line)`` for every import statement anywhere in module ``name``: lazykern
    modules resolved (``from .pkg import mod`` names ``lazykern...pkg.mod`` where that is a module),
    other names as written."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append((candidate if candidate in MODULES else base, node.lineno))
    return found


def _lazykern_imports(name: str) -> set[str]:
    """The lazykern modules ``name`` imports, with the packages whose ``__init__`` that import runs
    (not its own ancestors: they are already being imported when it runs)."""
    ancestors = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}
    out = set()
    for imported, _ in _imports(name):
        if imported.split(".")[0] != "lazykern":
            continue
        parts = imported.split(".")
        out |= {".".join(parts[:k]) for k in range(2, len(parts) + 1)} - ancestors - {name}
    return out & set(MODULES)


def _unit(name: str) -> str:
    """The layer unit of a module: ``lazykern`` itself, or its top-level module or package."""
    return ".".join(name.split(".")[:2])


APPLICATION_MARK = "# application"


def _table() -> tuple[list[set[str]], set[str]]:
    """The layer table of docs/architecture.rst, lowest first: the lines of the ``text`` block
    captioned "The layers", each a layer of unit names (``lazykern.`` omitted); and the application
    wing, the units on the lines after the comment line that starts with ``# application``, but for
    the package root (``lazykern``, the top line, which re-exports both)."""
    text = ARCHITECTURE.read_text()
    match = re.search(r"\.\. code-block:: text\n   :caption: The layers[^\n]*\n\n((?:   [^\n]*\n|\n)+)", text)
    assert match, "docs/architecture.rst has no layer table (a text block captioned 'The layers')"
    layers, wing, in_wing = [], set(), False
    for line in match.group(1).splitlines():
        in_wing = in_wing or line.strip().startswith(APPLICATION_MARK)
        units = {"lazykern" if u == "lazykern" else f"lazykern.{u}" for u in line.split("#")[0].split()}
        if units:
            layers.append(units)
        if in_wing:
            wing |= units - {"lazykern"}
    return layers, wing


LAYERS, APPLICATION = _table()
LAYER_OF = {unit: k for k, units in enumerate(LAYERS) for unit in units}
ENGINES = LAYERS[LAYER_OF["lazykern.cpu"]]  # the engines' layer: the C target's and its siblings


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES}
    assert units - set(LAYER_OF) == set(), "units missing from the layer table of docs/architecture.rst"
    assert set(LAYER_OF) - units == set(), "the layer table names units that do not exist"


def test_each_unit_imports_only_lower_layers():
    wrong = []
    for name in MODULES:
        for imported in _lazykern_imports(name):
            a, b = _unit(name), _unit(imported)
            if a != b and LAYER_OF[b] >= LAYER_OF[a]:
                wrong.append(f"{name} imports {imported} (layer {LAYER_OF[a] + 1} -> {LAYER_OF[b] + 1})")
    assert wrong == []


def test_the_library_never_imports_the_application():
    """The application wing of the table (the UCI job, the command, the data loader, the component
    analysis and the kernel names) sits on the library: no module of a library unit imports a unit of
    the wing, at its top or inside a function; the package root, above both, re-exports either."""
    assert {"lazykern.regression", "lazykern.cli"} <= APPLICATION, "the table's application wing was not read"
    library = set(LAYER_OF) - APPLICATION - {"lazykern"}
    assert "lazykern.kernels" in library and "lazykern.timing" in library
    wrong = [(name, imported) for name in MODULES if _unit(name) in library
             for imported in _lazykern_imports(name) if _unit(imported) in APPLICATION]
    assert wrong == []


def test_the_engines_are_one_layer_of_siblings():
    """No engine imports another (each is its own unit in one layer, so the rule above forbids it);
    checked by name too, so that a table edit cannot quietly allow it."""
    assert {f"lazykern.{name}" for name in ("cpu", "triton", "keops", "torch_engine")} <= ENGINES
    wrong = [(name, imported) for name in MODULES for imported in _lazykern_imports(name)
             if _unit(name) in ENGINES and _unit(imported) in ENGINES - {_unit(name)}]
    assert wrong == []


def test_no_import_circle():
    graph = {name: _lazykern_imports(name) for name in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    circles = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert circles == []


def test_formulas_import_no_engine_library():
    wrong = [(name, imported, line) for name in MODULES if _unit(name) == "lazykern.formulas"
             for imported, line in _imports(name) if imported.split(".")[0] in ENGINE_LIBRARIES]
    assert wrong == []


def test_the_checks_see_function_level_imports():
    """The reader finds an import inside a function body (what a deferred import looks like)."""
    name = "lazykern.keops.session"
    assert any(imported == "pykeops.torch" for imported, _ in _imports(name))


def test_a_product_asks_the_chooser_once(monkeypatch):
    calls = []
    choose = backend.choose_engine
    monkeypatch.setattr(backend, "choose_engine", lambda *args: calls.append(1) or choose(*args))
    x = torch.randn(50, 3, dtype=torch.float64)
    v = torch.randn(50, 2, dtype=torch.float64)
    kernel = lazykern.RBFKernel(ard_num_dims=3).double()
    with settings.max_dense_bytes(0), torch.no_grad():
        out = kernel(x) @ v
    assert calls == [1]
    assert out.shape == (50, 2)


def _string_constants(path: pathlib.Path) -> list[tuple[str, int]]:
    """String literals of a module that are code, not prose (docstrings are left out)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.value, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.parametrize("path", sorted((ROOT / "operators").glob("*.py")), ids=lambda p: p.name)
def test_no_operator_module_names_an_engine(path):
    names = set(backend.ENGINES)
    assert {"cpu", "keops", "triton", "torch"} <= names
    assert [(s, line) for s, line in _string_constants(path) if s in names] == []


def test_the_engine_name_check_would_see_one(tmp_path):
    """The check above finds an engine's name written as a string in code (and not in a docstring)."""
    path = tmp_path / "gate.py"
    path.write_text('def gate(engine):\n    """Docstrings may say "cpu"."""\n    return engine in ("cpu", "triton")\n')
    assert [s for s, _ in _string_constants(path)] == ["cpu", "triton"]


def _declares_formula(path: pathlib.Path) -> list[int]:
    """Lines where a module binds the name ``Formula`` itself (a class, an assignment or an alias)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            targets = [node] if isinstance(node, ast.ClassDef) else []
        if any(getattr(t, "id", getattr(t, "name", None)) == "Formula" for t in targets):
            found.append(node.lineno)
    return found


def test_one_formula_protocol():
    """What engines rely on in a formula is declared once (:mod:`lazykern.formulas.protocol`) and
    imported everywhere else, never re-declared as a module's own alias."""
    wrong = {name: lines for name, path in MODULES.items() if name != "lazykern.formulas.protocol"
             for lines in [_declares_formula(path)] if lines}
    assert wrong == {}
    assert _declares_formula(MODULES["lazykern.formulas.protocol"]), "the check sees the protocol's own class"


def test_nothing_above_the_chooser_imports_an_engine():
    """Only the chooser (:mod:`lazykern.backend`) and the engine packages themselves import an engine
    package: every other module reaches an engine through the chooser and the engine contract."""
    wrong = [(name, imported) for name in MODULES if _unit(name) not in ENGINES | {"lazykern.backend"}
             for imported in _lazykern_imports(name) if _unit(imported) in ENGINES]
    assert wrong == []


def test_each_engine_has_one_face():
    """Every engine of the chooser's table is ``<engine package>.engine.ENGINE``, one per package,
    and that is what the package exports (no module-level products beside it)."""
    import importlib

    faces = {unit: importlib.import_module(f"{unit}.engine").ENGINE for unit in ENGINES}
    assert sorted(faces.values(), key=id) == sorted(backend.ENGINES.values(), key=id)
    for unit, engine in faces.items():
        package = importlib.import_module(unit)
        assert package.ENGINE is engine
        assert not {"matmul", "dense", "supports", "symmetric_gradients"} & set(vars(package)), unit
