from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from runs.models import Agent


class Command(BaseCommand):
    help = "Create an agent and print its API token, alone on the last line (shown only once)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the agent's name (unique)")

    def handle(self, *args, name: str, **options):
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("The name must be 1 to 100 characters.")
        if Agent.objects.filter(name=name).exists():
            raise CommandError(
                f"An agent named {name!r} exists already; rotate its token in the admin."
            )
        agent = Agent(name=name)
        token = agent.set_new_token()
        agent.save()
        self.stdout.write(f"Created agent {name} ({agent.pk}). Its token, shown only once:")
        self.stdout.write(token)
