from __future__ import annotations

from runs.calls import record_call
from runs.lifecycle import start_run
from runs.models import EffectStatus


def test_a_replay_of_a_done_key_is_skipped(agent):
    started = start_run(agent, "job-1")
    first = record_call(
        agent,
        started.run.pk,
        attempt=1,
        tool="reply",
        kind="effect",
        args={"body": "hi"},
        key="outlook:message:1",
        key_source="provider",
    )
    assert first.action == "execute"
    assert first.effect.status == EffectStatus.IN_FLIGHT
