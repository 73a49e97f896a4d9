from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from django.db import transaction

from approvals.demo import DEMO_AGENT, demo_token, seed_demo_runs
from runs.models import Agent

DEMO_OPERATOR = "demo"
DEMO_PASSWORD = "demo-operator"


class Command(BaseCommand):
    help = (
        "Seed the demo operator login, a demo agent (its token is printed) and demo runs. "
        "Safe to run again: it keeps what exists, and the demo agent's token stays the "
        "same while SECRET_KEY does (make run keeps its key in var/dev.env)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000",
            help="the console's address, for the printed links (make run passes its port)",
        )

    def handle(self, *args, base_url: str, **options):
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
            token = agent.set_token(demo_token())
            agent.is_active = True
            agent.save()
            seeded = seed_demo_runs(agent)
        base = base_url.rstrip("/")
        self.stdout.write(
            f"Demo operator (operators + admins): {DEMO_OPERATOR} / {DEMO_PASSWORD}"
            f"{' (created)' if created else ''}"
        )
        self.stdout.write(f"Demo runs: {seeded}")
        self.stdout.write(f"Console: {base}/   Admin: {base}/admin/")
        self.stdout.write(
            f"Token of the agent {DEMO_AGENT}, the same at every start "
            "(export STARTSAFE_TOKEN=...):"
        )
        self.stdout.write(token)
