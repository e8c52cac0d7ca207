"""`manage.py create_api_token USER`: a token printed for an active user, for scripts
and CI."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from webapp.runs.api_token import ApiToken

pytestmark = pytest.mark.django_db


def test_the_command_prints_a_token_for_the_user(operator):
    out = StringIO()

    call_command("create_api_token", "otto", "--name", "ci", stdout=out)

    token = out.getvalue().strip()
    assert ApiToken.authenticate(token) == operator
    assert ApiToken.objects.get(user=operator).name == "ci"


def test_the_command_refuses_an_unknown_user():
    with pytest.raises(CommandError, match=r"No user named 'nobody'\. .* createsuperuser"):
        call_command("create_api_token", "nobody", stdout=StringIO())


def test_the_command_refuses_an_inactive_user(viewer):
    viewer.is_active = False
    viewer.save()

    with pytest.raises(CommandError, match="inactive"):
        call_command("create_api_token", "vera", stdout=StringIO())
    assert not ApiToken.objects.exists()
