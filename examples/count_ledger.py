"""Count the effects in a ledger and the duplicates among them.

    python examples/count_ledger.py var/ledger.jsonl

Exits 0 when every effect appears once, 1 when some appear more than once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ledger  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledger", help="the ledger file (JSON lines)")
    options = parser.parse_args(argv)

    counts = ledger.counts(options.ledger)
    total = sum(counts.values())
    duplicates = sum(n - 1 for n in counts.values())
    print(f"effects: {total} ({len(counts)} distinct)")
    for (kind, identity), n in sorted(counts.items()):
        mark = "  <- DUPLICATE" if n > 1 else ""
        print(f"  {kind:<9} {identity}  x{n}{mark}")
    print(f"duplicates: {duplicates}")
    return 1 if duplicates else 0


if __name__ == "__main__":
    sys.exit(main())
