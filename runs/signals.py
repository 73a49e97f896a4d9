"""What the journal announces to the rest of the project.

``runs/`` never imports ``approvals/``: the sweep and the hand-off say what happened
with a signal, and whoever cares (``approvals/``, which tells operators) listens.
Receivers run in the sender's transaction, so what they write commits or rolls back
with the news itself (``send``, not ``send_robust``: a receiver that fails fails the
transaction, as a direct call would).
"""

from __future__ import annotations

from django.dispatch import Signal

# Runs now wait for a person's decision (interrupted and not handed back
# automatically, or a restart hand-off given up). Sent with ``runs``, a list of
# (run, why) pairs, and ``now``; ``sender`` is ``Run``.
runs_need_person = Signal()
