"""The management commands: create_agent and sweep."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.utils import timezone
from lifecycle_helpers import send, start

from runs.models import Agent, EffectStatus, RunStatus, hash_token

pytestmark = pytest.mark.django_db


def test_create_agent_prints_its_token_alone_on_the_last_line():
    out = StringIO()

    call_command("create_agent", "billing-bot", stdout=out)

    token = out.getvalue().strip().splitlines()[-1]
    agent = Agent.objects.get(name="billing-bot")
    assert token.startswith("ss_") and " " not in token
    assert agent.token_matches(token)
    # Only the hash is stored: the clear token is nowhere in the row.
    assert agent.token_hash == hash_token(token)
    assert token not in (agent.token_hash, agent.token_hint)


def test_create_agent_prints_only_the_token_on_standard_output():
    """So ``STARTSAFE_TOKEN=$(manage.py create_agent NAME)`` needs no pipe that would
    hide the command's failure; what it says about the token goes to standard error."""
    out, err = StringIO(), StringIO()

    call_command("create_agent", "billing-bot", stdout=out, stderr=err)

    assert out.getvalue().count("\n") == 1 and out.getvalue().startswith("ss_")
    assert "Created agent billing-bot" in err.getvalue()


def test_create_agent_refuses_a_name_that_exists_and_says_what_to_do(agent):
    with pytest.raises(CommandError, match=f"create_agent {agent.name} --new-token"):
        call_command("create_agent", agent.name, stdout=StringIO())

    assert Agent.objects.filter(name=agent.name).count() == 1
    agent.refresh_from_db()
    assert agent.token_matches(agent.token)


def test_create_agent_new_token_replaces_the_token_of_an_agent_that_exists(agent):
    out, err = StringIO(), StringIO()

    call_command("create_agent", agent.name, "--new-token", stdout=out, stderr=err)

    token = out.getvalue().strip()
    agent.refresh_from_db()
    assert agent.token_matches(token) and not agent.token_matches(agent.token)
    assert agent.token_rotated_at is not None
    assert "stops working" in err.getvalue()
    assert Agent.objects.filter(name=agent.name).count() == 1


def test_create_agent_new_token_needs_an_agent_that_exists():
    with pytest.raises(CommandError, match="no agent named 'ghost-bot'"):
        call_command("create_agent", "ghost-bot", "--new-token", stdout=StringIO())

    assert not Agent.objects.filter(name="ghost-bot").exists()


def test_another_token_does_not_authenticate_the_agent(agent, other_agent):
    assert agent.token_matches(agent.token)
    assert not agent.token_matches(other_agent.token)


def test_sweep_interrupts_stale_runs_and_says_what_it_did(agent):
    t0 = timezone.now()
    run = start(agent, heartbeat_timeout=30, now=t0).run
    effect = send(agent, run, key=None, now=t0).effect
    out = StringIO()

    with time_machine.travel(t0 + timedelta(minutes=5), tick=False):
        call_command("sweep", stdout=out)

    assert "1 run(s) interrupted" in out.getvalue()
    assert "1 need a person" in out.getvalue()
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


def test_sweep_with_nothing_to_do_says_so(agent):
    out = StringIO()

    call_command("sweep", stdout=out)

    assert "0 run(s) interrupted" in out.getvalue()
