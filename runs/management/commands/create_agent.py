from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from runs.models import Agent


class Command(BaseCommand):
    help = (
        "Create an agent and print its API token (shown only once), alone on standard "
        "output: STARTSAFE_TOKEN=$(manage.py create_agent NAME) captures just the token, "
        "and the command's failure too. --new-token gives an agent that exists a new token."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="the agent's name (unique)")
        parser.add_argument(
            "--new-token",
            action="store_true",
            help="the agent exists: give it a new token (its old token stops working at once)",
        )

    def handle(self, *args, name: str, new_token: bool, **options):
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("The name must be 1 to 100 characters.")
        agent = Agent.objects.filter(name=name).first()
        if new_token:
            if agent is None:
                raise CommandError(
                    f"There is no agent named {name!r}: create it with "
                    f"`manage.py create_agent {name}`."
                )
            token = agent.rotate_token()
            self._note(
                f"New token of agent {name} ({agent.pk}), shown only once; "
                "its old token stops working now:"
            )
        else:
            if agent is not None:
                raise CommandError(
                    f"An agent named {name!r} exists already, and its token was shown only "
                    f"once, when it was created. To give it a new one (its old token stops "
                    f"working): manage.py create_agent {name} --new-token"
                )
            agent = Agent(name=name)
            token = agent.set_new_token()
            agent.save()
            self._note(f"Created agent {name} ({agent.pk}). Its token, shown only once:")
        # The token alone on standard output, everything else on standard error.
        self.stdout.write(token)

    def _note(self, text: str) -> None:
        self.stderr.write(text, style_func=self.style.SUCCESS)
