"""What the console's pages and actions share: access helpers, queries, diffs, answers.

Access rule (product.md, "Roles"): every signed-in, active user may read the queue,
runs and effects; only operators (``approvals.decide``) may act; only admins
(``approvals.view_history``) see the restart history and the audit log. An id
nobody can see (it does not exist) answers 404, checked before the role (403).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any

from django.db import connection
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from django.utils.http import url_has_allowed_host_and_scheme

from approvals.decisions import RUN_ACTION_STATUSES
from runs.models import Effect, EffectStatus, EffectVersion, Run
from runs.verdict import restart_verdicts

HISTORY_PERMISSION = "approvals.view_history"

# The queue shows at most this many rows per section (nearest deadline first), so
# its cost stays flat however long the backlog grows; the nav counts give the total.
# Each row carries its action forms, and Django's templates render one in ~0.5-1 ms:
# 100 rows (50/25/25) made the page's p99 256 ms at the bench's scale, over the
# 150 ms target; 55 rows halve the page (92 -> 47 ms in-process, docs/performance.md,
# p99 112 ms in make bench). A screen of 25
# deadlines is what an operator works through before the page refreshes; "Show
# more" (``?more=1``) raises each section to QUEUE_MORE_LIMIT for a long list.
QUEUE_LIMITS = {"awaiting": 25, "stopped": 15, "unknown": 15}
QUEUE_MORE_LIMIT = 200

# --- Access -------------------------------------------------------------------


def _effect_for_user(request: HttpRequest, effect_id: Any) -> Effect:
    """The effect with what its pages show, or 404 for an id the user may not see."""
    # Its escalation (a reverse one-to-one) joined too: the page says when it escalated.
    queryset = Effect.objects.select_related("run", "agent", "claimed_run", "escalation")
    return get_object_or_404(queryset, pk=effect_id)


def _run_for_user(request: HttpRequest, run_id: Any) -> Run:
    queryset = Run.objects.select_related("agent", "override_by")
    return get_object_or_404(queryset, pk=run_id)


# --- Redirects ----------------------------------------------------------------


def safe_back_url(request: HttpRequest, fallback: str) -> str:
    """The page the form came from (``next``, then Referer) when it is on this site.

    The console's forms send no ``next`` (their Referer is the page they are on, as
    ``Referrer-Policy: same-origin`` keeps it); the editor's confirm does."""
    for candidate in (request.POST.get("next"), request.headers.get("referer")):
        if candidate and url_has_allowed_host_and_scheme(
            candidate, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            return candidate
    return fallback


# --- JSON and diffs -----------------------------------------------------------


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def diff_lines(old: Any, new: Any) -> list[tuple[str, str]]:
    """A unified diff of two JSON values, pretty-printed, as (kind, line) pairs.

    kind is "add", "del", "hunk" or "same", so the template can colour each line.
    """
    lines = difflib.unified_diff(
        pretty(old).splitlines(), pretty(new).splitlines(), lineterm="", n=3
    )
    out = []
    for line in lines:
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            out.append(("hunk", line))
        elif line.startswith("+"):
            out.append(("add", line))
        elif line.startswith("-"):
            out.append(("del", line))
        else:
            out.append(("same", line))
    return out


def versions_with_diffs(versions: list[EffectVersion]) -> list[dict]:
    """Each version with its diff from the adopted version before it.

    Drift (``adopted`` false) is compared with the adopted version it tried to
    replace, so the diff shows what the replay would have changed.
    """
    rows = []
    previous_adopted = None
    for version in versions:
        diff = diff_lines(previous_adopted.args, version.args) if previous_adopted else []
        rows.append({"version": version, "diff": diff})
        if version.adopted:
            previous_adopted = version
    return rows


# --- Queue --------------------------------------------------------------------


def queue_sets() -> tuple:
    """Count and latest change of each set the queue shows, in one query.

    Each set is read through its partial index on ``updated_at``
    (``effect_awaiting_updated_idx``, ``effect_unknown_idx``,
    ``run_queue_decide_idx``), by index-only scans, so the cost follows what
    waits for a person, not the size of the journal: aggregating all effects, as
    a first version did, scanned a million rows on every queue poll.
    """
    awaiting = Effect.objects.filter(status=EffectStatus.AWAITING_APPROVAL)
    unknown = Effect.objects.filter(status=EffectStatus.UNKNOWN)
    stopped = needs_decision_runs()
    # One statement of scalar subqueries over the ORM's own SQL for each set.
    parts, params = [], []
    for queryset in (awaiting, unknown, stopped):
        sql, sql_params = queryset.order_by().values("updated_at").query.sql_with_params()
        parts.append(f"(SELECT count(*) FROM ({sql}) s), (SELECT max(updated_at) FROM ({sql}) s)")
        params += [*sql_params, *sql_params]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        return cursor.fetchone()


def queue_fingerprint(sets: tuple) -> str:
    """A short hash that changes whenever anything the queue shows may have changed.

    Every change of an effect or a run moves its ``updated_at`` (lifecycle's
    ``save_effect`` and ``set_run_status``), so the count and the latest
    ``updated_at`` of each set the queue lists (awaiting, unknown, stopped runs)
    change with any row entering, leaving or changing in it: one query tells the
    poll whether a render is needed at all.
    """
    raw = "|".join(str(value) for value in sets)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def nav_counts(sets: tuple | None = None) -> dict[str, int]:
    """The numbers in the navigation: what waits for a person (one query, none when
    the caller already read ``queue_sets()``)."""
    awaiting, _, unknown, _, stopped, _ = sets if sets is not None else queue_sets()
    return {
        "awaiting": awaiting,
        "unknown": unknown,
        "stopped": stopped,
        "total": awaiting + unknown + stopped,
    }


def needs_decision_runs():
    """Stopped runs with no operator's "allow restart" waiting: a person must decide."""
    return Run.objects.filter(status__in=RUN_ACTION_STATUSES, restart_ready=False)


def verdict_reasons_for(runs: list[Run]) -> dict[Any, dict]:
    """What the queue shows of each run's verdict (``Verdict.for_queue``), for many
    runs in the verdict's own three queries (``runs.verdict.restart_verdicts``)."""
    return {pk: verdict.for_queue() for pk, verdict in restart_verdicts(runs).items()}
