"""The control room in a real browser: sign in, create a run, see field messages."""

import json

import pytest
from django.contrib.auth.models import Permission

from webapp.runs.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def operator_with_password(django_user_model):
    user = django_user_model.objects.create_user("olga", password="islands-4-ever")
    user.user_permissions.add(Permission.objects.get(codename="add_run",
                                                     content_type__app_label="runs"))
    return user


def sign_in(page, live_server, username: str, password: str) -> None:
    page.goto(f"{live_server.url}/")
    assert "/accounts/login/" in page.url  # anonymous users only see the sign-in page
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    with page.expect_navigation():
        page.get_by_role("button", name="Log in").click()
    assert page.url == f"{live_server.url}/", page.url


def test_an_operator_signs_in_and_creates_a_run(page, live_server, operator_with_password):
    sign_in(page, live_server, "olga", "islands-4-ever")
    page.goto(f"{live_server.url}/runs/new/")
    page.fill("input[name=name]", "browser run")
    # The form comes filled with a valid default config.
    page.get_by_role("button", name="Create run").click()
    page.wait_for_url("**/runs/*/")
    run = Run.objects.get(name="browser run")
    assert page.url.endswith(f"/runs/{run.pk}/")
    assert "browser run" in page.content()
    assert run.islands.count() == len(run.config["islands"])


def test_a_bad_config_shows_its_message_beside_the_field_and_saves_nothing(
        page, live_server, operator_with_password):
    sign_in(page, live_server, "olga", "islands-4-ever")
    page.goto(f"{live_server.url}/runs/new/")
    page.fill("input[name=name]", "too many quorum")
    config = json.loads(page.input_value("textarea[name=config]"))
    config["sync"]["min_quorum"] = 9
    page.fill("textarea[name=config]", json.dumps(config))
    page.get_by_role("button", name="Create run").click()
    message = page.locator("#field-config .errorlist")
    message.wait_for()
    assert "sync.min_quorum" in message.inner_text()
    assert "number of islands (2)" in message.inner_text()
    assert not Run.objects.filter(name="too many quorum").exists()
