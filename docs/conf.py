"""Sphinx configuration: API reference from docstrings (autodoc + napoleon); every cross-reference
must resolve (``nitpicky``), and the build runs with ``-W`` in tests/test_docs.py.

References into Python, torch, GPyTorch and linear_operator resolve through intersphinx
inventories committed in ``_inventories/`` (CI and the test machines cannot reach those sites);
``make_inventories.py`` regenerates them from the installed packages.
"""

import inspect
import typing

project = "lazykern"
author = "lazykern developers"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "furo"
exclude_patterns = ["_build", "_inventories"]
nitpicky = True
# Only external targets that their project's inventory genuinely lacks may stay unresolved.
nitpick_ignore = [
    # ctypes documents no class for a loaded C function (lazykern.native.load_source returns one).
    ("py:class", "_ctypes.CFuncPtr"),
    # torch documents ``torch.distributed.ProcessGroup`` nowhere its inventory can point to.
    ("py:class", "torch.distributed.distributed_c10d.ProcessGroup"),
    # No NumPy or scikit-learn inventory is stored here (the build runs offline): KernelRidge's bases
    # and its NumPy return type stay plain names.
    ("py:class", "numpy.ndarray"),
    ("py:class", "sklearn.base.BaseEstimator"),
    ("py:class", "sklearn.base.RegressorMixin"),
    # Nor a BoTorch inventory: lazykern.botorch's return types stay plain names.
    ("py:class", "botorch.sampling.pathwise.paths.GeneralizedLinearPath"),
    ("py:class", "botorch.sampling.pathwise.features.maps.KernelFeatureMap"),
    ("py:class", "botorch.sampling.pathwise.features.maps.FeatureMap"),
]
intersphinx_mapping = {
    "python": ("https://docs.python.org/3/", "_inventories/python.inv"),
    "torch": ("https://docs.pytorch.org/docs/stable/", "_inventories/torch.inv"),
    "gpytorch": ("https://docs.gpytorch.ai/en/stable/", "_inventories/gpytorch.inv"),
    "linear_operator": ("https://", "_inventories/linear_operator.inv"),
}


def _public_bases(app, name, obj, options, bases):
    """Show a class's documented ancestors, not lazykern's private mixins (``Lazy*Mixin`` and the
    like live in modules the reference does not document)."""
    def private(base):
        return base.__module__.startswith("lazykern.") and base.__name__.startswith(("LazyKernelMixin", "LazyStationary", "_"))

    bases[:] = [b for b in bases if not private(b)]


def _evaluated_annotations(app, obj, bound_method):
    """Evaluate string annotations (``from __future__ import annotations``) before autodoc reads a
    signature: for class signatures autodoc otherwise keeps them as written (``Tensor``), which
    resolve to nothing."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        target.__annotations__ = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - builtins, C functions: nothing to evaluate
        pass


def _sklearn_routing(app, what, name, obj, skip, options):
    """scikit-learn generates metadata-routing setters (``set_fit_request``, ...) on every estimator
    (KernelRidge): its API, not lazykern's, and their docstrings point into scikit-learn's docs."""
    return True if name.startswith("set_") and name.endswith("_request") else None


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-before-process-signature", _evaluated_annotations)
    app.connect("autodoc-skip-member", _sklearn_routing)
