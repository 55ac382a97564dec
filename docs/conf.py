"""Sphinx configuration: API reference from docstrings (autodoc + napoleon), warnings are errors in CI."""

project = "lazykern"
author = "lazykern developers"
extensions = [
    "sphinx.ext.autodoc",
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
exclude_patterns = ["_build"]
nitpicky = False
suppress_warnings = ["ref.python"]
