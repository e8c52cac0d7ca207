"""Sign-in with a limit on failed attempts (webapp.dashboard.login): after five
failures for a username from an address, the form and the admin's refuse even the
right password, without checking it, until the window has passed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.db.models import F
from django.test import Client, RequestFactory

from webapp.dashboard.login import axes_username

pytestmark = pytest.mark.django_db


def sign_in(client: Client, username: str, password: str, address: str = "10.0.0.1"):
    return client.post("/accounts/login/", {"username": username, "password": password},
                       REMOTE_ADDR=address)


@pytest.fixture
def sam(django_user_model, settings):
    settings.AXES_FAILURE_LIMIT = 5
    settings.AXES_COOLOFF_TIME = timedelta(seconds=300)
    return django_user_model.objects.create_user("sam", password="a right password 9")


def test_after_five_failed_sign_ins_the_form_refuses_even_the_right_password(sam):
    client = Client()
    for _ in range(5):
        assert b"Please enter a correct username" in sign_in(client, "sam", "wrong").content

    refused = sign_in(client, "sam", "a right password 9")

    assert refused.status_code == 200
    assert b"Too many failed sign-ins; try again in 5 minutes." in refused.content
    assert "_auth_user_id" not in client.session


def test_the_limit_does_not_check_the_password_while_it_lasts(sam, monkeypatch):
    client = Client()
    for _ in range(5):
        sign_in(client, "sam", "wrong")
    checked = []
    monkeypatch.setattr("django.contrib.auth.forms.authenticate",
                        lambda *args, **kwargs: checked.append(kwargs))

    sign_in(client, "sam", "a right password 9")

    assert checked == []


def test_the_limit_is_per_username_and_address(sam, django_user_model):
    django_user_model.objects.create_user("ria", password="another password 9")
    client = Client()
    for _ in range(5):
        sign_in(client, "sam", "wrong")

    other_user = sign_in(client, "ria", "another password 9")
    other_address = sign_in(Client(), "sam", "a right password 9", address="10.0.0.2")

    assert other_user.status_code == 302
    assert other_address.status_code == 302


def test_the_limit_counts_a_username_whatever_its_case(sam):
    client = Client()
    for _ in range(5):
        sign_in(client, "Sam", "wrong")

    refused = sign_in(client, "sam", "a right password 9")

    assert b"Too many failed sign-ins" in refused.content


def test_the_admin_sign_in_is_under_the_limit_too(sam):
    sam.is_staff = True
    sam.save()
    client = Client()
    for _ in range(5):
        client.post("/admin/login/", {"username": "sam", "password": "wrong"},
                    REMOTE_ADDR="10.0.0.1")

    refused = client.post("/admin/login/", {"username": "sam", "password": "a right password 9"},
                          REMOTE_ADDR="10.0.0.1")

    assert refused.status_code == 200
    assert b"Too many failed sign-ins; try again in 5 minutes." in refused.content
    assert "_auth_user_id" not in client.session


def age_failures(seconds: float) -> None:
    """Move the recorded failures back in time, as if that long had passed."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(seconds=seconds))


def test_the_limit_lifts_when_its_window_has_passed(sam):
    client = Client()
    for _ in range(5):
        sign_in(client, "sam", "wrong")
    age_failures(60)
    assert b"try again in 4 minutes" in sign_in(client, "sam", "a right password 9").content

    age_failures(241)

    assert sign_in(client, "sam", "a right password 9").status_code == 302


def test_a_successful_sign_in_clears_the_count(sam):
    client = Client()
    for _ in range(4):
        sign_in(client, "sam", "wrong")
    assert sign_in(client, "sam", "a right password 9").status_code == 302
    client.logout()

    for _ in range(4):
        sign_in(client, "sam", "wrong")

    assert sign_in(client, "sam", "a right password 9").status_code == 302


def test_axes_counts_a_username_stripped_and_lowercased_from_the_credentials_or_the_post():
    request = RequestFactory().post("/accounts/login/", {"username": " Sam "})

    assert axes_username(request, None) == "sam"
    assert axes_username(request, {"username": "RIA"}) == "ria"
    assert axes_username(RequestFactory().post("/accounts/login/", {}), None) == ""


def test_behind_a_trusted_proxy_one_address_failing_locks_out_no_other(sam, settings):
    """With TRUSTED_PROXY_COUNT every request comes from the proxy: the address that
    counts is the client's, from X-Forwarded-For."""
    settings.AXES_IPWARE_META_PRECEDENCE_ORDER = ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR")
    settings.AXES_IPWARE_PROXY_COUNT = 0
    settings.IPWARE_STRICT = True
    attacker, proxy = Client(), "10.0.0.9"
    for _ in range(5):
        attacker.post("/accounts/login/", {"username": "sam", "password": "wrong"},
                      REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="198.51.100.66")

    refused = attacker.post("/accounts/login/", {"username": "sam",
                                                 "password": "a right password 9"},
                            REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="198.51.100.66")
    sam_himself = Client().post("/accounts/login/", {"username": "sam",
                                                     "password": "a right password 9"},
                                REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="198.51.100.7")

    assert b"Too many failed sign-ins" in refused.content
    assert sam_himself.status_code == 302
