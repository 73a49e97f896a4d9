from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from django.db import transaction

from runs.models import Agent

DEMO_OPERATOR = "demo"
DEMO_PASSWORD = "demo-operator"
DEMO_AGENT = "demo-agent"


class Command(BaseCommand):
    help = (
        "Seed the demo operator login, a demo agent (its token is printed) and demo runs. "
        "Safe to run again: it keeps what exists and gives the demo agent a fresh token."
    )

    def handle(self, *args, **options):
        with transaction.atomic():
            operator, created = User.objects.get_or_create(
                username=DEMO_OPERATOR, defaults={"email": "demo@example.com"}
            )
            operator.set_password(DEMO_PASSWORD)
            operator.save()
            operator.groups.add(
                Group.objects.get(name="operators"), Group.objects.get(name="admins")
            )
            agent = Agent.objects.filter(name=DEMO_AGENT).first() or Agent(name=DEMO_AGENT)
            token = agent.set_new_token()
            agent.is_active = True
            agent.save()
            from runs.demo import seed_demo_runs

            seeded = seed_demo_runs(agent)
        self.stdout.write(
            f"Demo operator (operators + admins): {DEMO_OPERATOR} / {DEMO_PASSWORD}"
            f"{' (created)' if created else ''}"
        )
        self.stdout.write(f"Demo runs: {seeded}")
        self.stdout.write("Console: http://127.0.0.1:8000/   Admin: http://127.0.0.1:8000/admin/")
        self.stdout.write(f"Token of the agent {DEMO_AGENT} (export STARTSAFE_TOKEN=...):")
        self.stdout.write(token)
