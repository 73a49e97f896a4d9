"""The journal's first promise end to end: a done key, replayed by a restart, is skipped."""

from __future__ import annotations

from runs.calls import record_call
from runs.lifecycle import start_run
from runs.models import AuditEvent, Call, Effect, EffectStatus
from runs.outcomes import complete_effect


def _reply(agent, run, attempt: int = 1):
    return record_call(
        agent,
        run.pk,
        attempt=attempt,
        tool="reply",
        kind="effect",
        args={"body": "hi"},
        key="outlook:message:1",
        key_source="provider",
    )


def test_a_replay_of_a_done_key_is_skipped(agent):
    run = start_run(agent, "job-1").run
    first = _reply(agent, run)
    assert first.action == "execute"
    complete_effect(
        agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "r-1"}
    )
    start_run(agent, "job-1", supersede=1)  # the run starts again and replays the call

    replay = _reply(agent, run, attempt=2)

    assert replay.action == "skip"
    assert replay.effect.pk == first.effect.pk
    assert replay.effect.result == {"id": "r-1"}
    effect = Effect.objects.get(pk=first.effect.pk)
    assert effect.status == EffectStatus.DONE
    # Journaled by both attempts, executed once.
    calls = Call.objects.filter(effect=effect).order_by("attempt_number")
    assert list(calls.values_list("attempt_number", "action")) == [(1, "execute"), (2, "skip")]
    assert AuditEvent.objects.filter(effect=effect, verb="claimed").count() == 1
