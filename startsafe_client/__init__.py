"""Forwards to the client package, which lives in ``startsafe_client/startsafe_client/``.

From the repository root (where ``manage.py`` and pytest run, with the root first
on ``sys.path``) this folder would otherwise shadow the installed package as an
empty namespace package. It points its ``__path__`` at the real package and runs
its ``__init__``, so ``import startsafe_client`` gives the same modules from
anywhere. Not part of the distribution (its ``pyproject.toml`` packages only the
inner folder).
"""

from __future__ import annotations

from pathlib import Path as _Path

__path__ = [str(_Path(__file__).resolve().parent / "startsafe_client")]
_init = _Path(__path__[0]) / "__init__.py"
exec(compile(_init.read_text(encoding="utf-8"), str(_init), "exec"))
