"""The development env file, ``var/dev.env``: what ``make run`` sets, for every shell.

Settings refuse to start without a ``SECRET_KEY`` unless ``DEBUG`` is on, and nobody
sets either on a developer's machine. ``make run`` writes them once to this file
(``DEBUG=1`` and a random ``SECRET_KEY`` of this clone's own), and settings read it
when it is there, so the README's commands in a second terminal
(``.venv/bin/python manage.py create_agent ...``) see what make run's processes see.

- A variable set in the environment always wins, even set empty: the file only fills
  in what is unset (python-dotenv's ``override=False``).
- The file is written once and kept: sessions signed and the demo agent's token
  (derived from the key, approvals/demo.py) survive a restart.
- A deployment never reads it: the Docker image has its own var folder
  (``STARTSAFE_VAR_DIR=/app/var``, and ``.dockerignore`` leaves ``var/`` out of the
  build), and ``check --deploy`` warns (startsafe.W001) when settings read one.

``python -m startsafe.devenv`` writes it (make run calls it).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from dotenv import dotenv_values, load_dotenv

from startsafe.env import env_str

BASE_DIR = Path(__file__).resolve().parent.parent
FILE_NAME = "dev.env"

_TEMPLATE = """\
# Written once by `make run` for local development; settings read this file when it
# is present. A variable set in the environment wins over it. Never deploy with it:
# delete it (`make clean` does) before serving this folder in production.
DEBUG=1
SECRET_KEY={secret_key}
"""


def var_dir() -> Path:
    """The folder of the SQLite file, the broker's folders, beat's schedule and this file."""
    return Path(env_str("STARTSAFE_VAR_DIR", str(BASE_DIR / "var")))


def load(folder: Path) -> Path | None:
    """Fill in the unset variables from ``folder/dev.env``; its path, or None without one."""
    path = folder / FILE_NAME
    if not path.is_file():
        return None
    load_dotenv(path, override=False, interpolate=False)
    return path


def values(path: Path) -> dict[str, str | None]:
    """What the file says, without touching the environment."""
    return dotenv_values(path, interpolate=False)


def write(folder: Path) -> tuple[Path, bool]:
    """Write ``folder/dev.env`` unless it exists (then it is kept as it is).

    Returns its path and whether it was written now. Only its owner may read it: it
    holds a signing key.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path, False
    with os.fdopen(fd, "w") as out:
        out.write(_TEMPLATE.format(secret_key=secrets.token_urlsafe(50)))
    return path, True


def main() -> None:
    path, written = write(var_dir())
    print(f"{'Wrote' if written else 'Development settings from'} {path}")


if __name__ == "__main__":
    main()
