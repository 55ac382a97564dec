r"""Which pykeops and keopscore versions lazykern's KeOps hooks were verified on, and whether the installed ones are.

lazykern's compile session (``lazykern.keops.session``) and its CUDA handling
(:mod:`lazykern.keops.discovery`, :mod:`lazykern.keops.nvrtc`) use private pykeops/keopscore
internals. With any other installed version, importing this module warns once and those hooks stay
off: lazykern's reductions then compile exactly as KeOps' own would (its flags, its cache folder).
The versions are read from the package metadata: importing pykeops itself is slow and chatty.

Example:
    >>> _version_problem({"pykeops": "2.3", "keopscore": "2.3.1"}) is None
    True
"""

from __future__ import annotations

import warnings
from importlib import metadata

__all__ = ["PATCHED_VERSIONS", "VERSION_PROBLEM"]

#: ``major.minor`` versions of pykeops and keopscore whose internals lazykern hooks.
PATCHED_VERSIONS = ("2.3",)


def _version_problem(versions: dict[str, str | None]) -> str | None:
    """Why lazykern must leave KeOps alone with these installed versions (``None``: it need not)."""
    bad = {name: v for name, v in versions.items() if v is None or ".".join(v.split(".")[:2]) not in PATCHED_VERSIONS}
    if not bad:
        return None
    found = ", ".join(f"{name} {v or '(not installed)'}" for name, v in bad.items())
    return (
        f"lazykern.keops hooks private internals of pykeops/keopscore {'/'.join(PATCHED_VERSIONS)}.x, found {found}: "
        "lazykern's reductions compile with KeOps' own flags into KeOps' own cache folder"
    )


def _installed_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in ("pykeops", "keopscore"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


#: Why lazykern's KeOps hooks are off (installed pykeops/keopscore versions they were not verified
#: on), or ``None`` when they are on. Read from the package metadata: importing pykeops itself is
#: slow and chatty.
VERSION_PROBLEM = _version_problem(_installed_versions())
if VERSION_PROBLEM is not None:
    warnings.warn(VERSION_PROBLEM, RuntimeWarning, stacklevel=2)
