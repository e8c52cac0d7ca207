"""python manage.py create_api_token USERNAME [--name NAME]: make an API token for a
user and print it (only its hash is kept, so this is the one time it is shown)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.runs.api_token import ApiToken


class Command(BaseCommand):
    help = ("Make an API token for USERNAME and print it; send it as "
            "'Authorization: Bearer <token>'. It acts with the user's role.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="An existing user (createsuperuser, the admin).")
        parser.add_argument("--name", default="", help="What the token is for, e.g. 'ci'.")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        User = get_user_model()
        user = User.objects.filter(**{User.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"No user named {username!r}. Create one with "
                               "python manage.py createsuperuser or in the admin.")
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive: a token of theirs would not "
                               "work. Activate them in the admin first.")
        _, token = ApiToken.issue(user, name)
        self.stdout.write(token)
