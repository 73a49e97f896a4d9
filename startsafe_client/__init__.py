"""Stands in for the client package, which lives in ``startsafe_client/startsafe_client/``.

From the repository root (where ``manage.py``, pytest and the tests' subprocesses
run, with the root first on ``sys.path``) this folder would otherwise shadow the
installed package as an empty namespace package: the import system settles for a
namespace package found on ``sys.path`` before it asks the finder of an editable
install. So this module loads the real package from its own file, with importlib's
recipe for importing a source file directly, and puts it in its own place in
``sys.modules``: ``import startsafe_client`` then gives the real package (its own
``__file__``, ``__path__`` and ``__spec__``) from anywhere. Not part of the
distribution (its ``pyproject.toml`` packages only the inner folder).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_package = Path(__file__).resolve().parent / "startsafe_client"
_spec = importlib.util.spec_from_file_location(
    __name__, _package / "__init__.py", submodule_search_locations=[str(_package)]
)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)
