"""Write the intersphinx inventories in ``docs/_inventories/`` from the installed packages.

The docs build must work offline (CI reaches only the package index), so the inventories of
Python, torch, GPyTorch and linear_operator are committed instead of downloaded. Each entry is
an object of the *installed* package, found by import, listed under its public name and under the
module path that defines it (what autodoc writes for base classes and type hints), pointing at the
project's public documentation (or, for objects that documentation omits, the source at the
installed version's tag).

Run after upgrading one of these packages, and commit the result::

    python3 docs/make_inventories.py
"""

from __future__ import annotations

import importlib
import inspect
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable

OUT = Path(__file__).resolve().parent / "_inventories"


def _role(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "py:module"
    if inspect.isclass(obj):
        return "py:exception" if issubclass(obj, BaseException) else "py:class"
    return "py:function"


def _resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return importlib.import_module(path)
    except ImportError:
        return getattr(importlib.import_module(module), name)


def _entries(names: Iterable[str], location: Callable[[str, Any], str]) -> list[tuple[str, str, str]]:
    """(name, role, location) for each public name and, if different, its defining path."""
    entries = []
    for public in names:
        obj = _resolve(public)
        role, uri = _role(obj), location(public, obj)
        entries.append((public, role, uri))
        defining = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if defining and qualname and not inspect.ismodule(obj) and f"{defining}.{qualname}" != public:
            entries.append((f"{defining}.{qualname}", role, uri))
    return entries


def _public(module: str) -> list[str]:
    mod = importlib.import_module(module)
    return [f"{module}.{name}" for name in mod.__all__ if not inspect.ismodule(getattr(mod, name))]


def _write(project: str, version: str, entries: list[tuple[str, str, str]]) -> None:
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    body = "".join(f"{name} {role} 1 {uri} -\n" for name, role, uri in sorted(set(entries)))
    OUT.mkdir(exist_ok=True)
    (OUT / f"{project}.inv").write_bytes(header.encode() + zlib.compress(body.encode()))
    print(f"{project} {version}: {len(set(entries))} entries")


def python_inventory() -> None:
    import sys

    builtins = ["int", "float", "str", "bool", "bytes", "tuple", "list", "dict", "object", "type"]
    exceptions = ["ValueError", "TypeError", "RuntimeError", "RuntimeWarning", "UserWarning", "KeyError",
                  "IndexError", "AttributeError", "NotImplementedError", "OSError", "ImportError"]
    typing_names = ["Any", "Callable", "Iterator", "Iterable", "Mapping", "Sequence", "Protocol"]

    def location(public: str, obj: Any) -> str:
        if public.startswith("builtins."):
            name = public.split(".", 1)[1]
            return f"library/exceptions.html#{name}" if name in exceptions else f"library/functions.html#{name}"
        module = public.rsplit(".", 1)[0]
        return f"library/{module}.html#{public}"

    # Builtins are referred to without their module.
    builtin_entries = _entries([f"builtins.{n}" for n in builtins + exceptions], location)
    entries = [(n.removeprefix("builtins."), r, u) for n, r, u in builtin_entries]
    entries += _entries(
        ["os.PathLike", "pathlib.Path", *(f"typing.{n}" for n in typing_names),
         *(f"collections.abc.{n}" for n in ["Callable", "Iterator", "Iterable", "Mapping", "Sequence"])],
        location,
    )
    _write("python", f"{sys.version_info.major}.{sys.version_info.minor}", entries)


def torch_inventory() -> None:
    import torch

    special = {
        "torch.Tensor": "tensors.html#torch.Tensor",
        "torch.dtype": "tensor_attributes.html#torch.dtype",
        "torch.device": "tensor_attributes.html#torch.device",
        "torch.Size": "size.html#torch.Size",
    }
    names = [*special, "torch.Generator", "torch.nn.Module", "torch.nn.Parameter", "torch.func.vjp",
             "torch.func.jvp", "torch.func.vmap", "torch.autograd.Function", "torch.autograd.grad",
             "torch.autograd.gradcheck", "torch.no_grad", "torch.enable_grad", "torch.set_flush_denormal"]
    entries = _entries(names, lambda public, obj: special.get(public, f"generated/{public}.html#{public}"))
    _write("torch", torch.__version__.split("+")[0], entries)


def gpytorch_inventory() -> None:
    import gpytorch

    pages = {
        "gpytorch.kernels": "kernels", "gpytorch.likelihoods": "likelihoods", "gpytorch.models": "models",
        "gpytorch.mlls": "marginal_log_likelihoods", "gpytorch.distributions": "distributions",
        "gpytorch.constraints": "constraints", "gpytorch.priors": "priors", "gpytorch.means": "means",
    }
    entries = [("gpytorch.settings", "py:module", "settings.html#module-gpytorch.settings")]
    for module, page in pages.items():
        entries += _entries(_public(module), lambda public, obj, page=page: f"{page}.html#{public}")
    _write("gpytorch", gpytorch.__version__, entries)


def linear_operator_inventory() -> None:
    import linear_operator

    version = linear_operator.__version__
    docs = "linear-operator.readthedocs.io/en/stable/"
    pages = {
        "composition_decoration_operators": ["AddedDiagLinearOperator", "CatLinearOperator",
                                             "ConstantMulLinearOperator", "KroneckerProductLinearOperator",
                                             "MatmulLinearOperator", "MulLinearOperator", "SumBatchLinearOperator"],
        "data_sparse_operators": ["DiagLinearOperator", "ConstantDiagLinearOperator", "IdentityLinearOperator",
                                  "RootLinearOperator", "ZeroLinearOperator"],
    }
    page_of = {f"linear_operator.operators.{n}": page for page, names in pages.items() for n in names}
    root = Path(linear_operator.__file__).resolve().parent.parent

    def location(public: str, obj: Any) -> str:
        if public in ("linear_operator.LinearOperator", "linear_operator.operators.LinearOperator"):
            return f"{docs}linear_operator.html#linear_operator.LinearOperator"
        if public in page_of:
            return f"{docs}{page_of[public]}.html#{public}"
        # Not in the rendered documentation: the source at the installed version.
        source = Path(inspect.getsourcefile(obj)).resolve().relative_to(root)
        return f"github.com/cornellius-gp/linear_operator/blob/v{version}/{source.as_posix()}"

    names = ["linear_operator.LinearOperator", *_public("linear_operator.operators")]
    _write("linear_operator", version, _entries(names, location))


if __name__ == "__main__":
    python_inventory()
    torch_inventory()
    gpytorch_inventory()
    linear_operator_inventory()
