"""The ledger: a JSON-lines file standing in for the providers (mailbox, warehouse, ESP).

Every side effect the example performs appends one line here, fsynced, so a crash
right after it cannot lose it and duplicates can be counted afterwards. Each line
names the effect by the provider's own identity of it (``kind`` + ``identity``):
the inbound message a reply answers, the SHA-256 of an imported dataset, the
campaign id — the same facts a real tool would look up at its provider.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def append(path: str | Path, kind: str, identity: str, details: dict[str, Any]) -> dict[str, Any]:
    """Perform an effect: append its line, flushed to disk, and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "kind": kind,
        "identity": identity,
        "at": datetime.now(UTC).isoformat(),
        "pid": os.getpid(),
        "details": details,
    }
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return entry


def entries(path: str | Path) -> list[dict[str, Any]]:
    """Every line of the ledger, in order (an absent ledger is empty)."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def find(path: str | Path, kind: str, identity: str) -> tuple[int, dict[str, Any]] | None:
    """The first line (1-based number, entry) for this effect, or ``None``.

    It reads the whole file as it is now: the provider's latest state, which is
    what makes a ``not_done`` answer from it trustworthy.
    """
    for number, entry in enumerate(entries(path), start=1):
        if entry["kind"] == kind and entry["identity"] == identity:
            return number, entry
    return None


def counts(path: str | Path) -> Counter[tuple[str, str]]:
    """How many times each effect (kind, identity) appears."""
    return Counter((e["kind"], e["identity"]) for e in entries(path))
