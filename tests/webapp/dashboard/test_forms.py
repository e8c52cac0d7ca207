"""The pages' forms and query strings under generated input (hypothesis): never a server
error, and nothing saved when the input is refused.

Forms: the new-run form (/runs/new/: every config field and island rows, any text),
the simulate form (/simulate/), the tokens form (/account/tokens/) and the sign-in
form. Query strings: the runs list, the new-run form (preset, from), compare and
simulate. The client turns an exception into a failed test, as a 500 would be.
FUZZ_CASES scales the examples as in tests/webapp/api/test_fuzz.py.
"""

from __future__ import annotations

import os
from dataclasses import fields
from urllib.parse import urlencode

import pytest
from django.test import Client
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from diloco.config import SECTIONS
from webapp.dashboard.forms import ISLAND_FIELDS
from webapp.runs.api_token import ApiToken
from webapp.runs.models import Run, Simulation

pytestmark = pytest.mark.django_db

FUZZ_CASES = int(os.environ.get("FUZZ_CASES", "260"))
EXAMPLES = max(10, FUZZ_CASES // 5)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))

CONFIG_FIELDS = [f"{section}.{f.name}" for section, cls in SECTIONS.items()
                 for f in fields(cls)]
# Any text (NUL and other control characters included), numbers written as text, and
# the odd values that break number parsing.
TEXT = st.one_of(st.text(max_size=40), st.integers().map(str),
                 st.floats(allow_nan=True, allow_infinity=True).map(repr),
                 st.sampled_from(["", " ", "1e400", "-1e400", "inf", "nan", "0x10", "²",
                                  "9" * 40, "us-east", "decoupled", "elastic", "none"]))
ISLAND_KEY = st.one_of(
    st.builds(lambda n, f: f"islands-{n}-{f}", st.integers(0, 3), st.sampled_from(ISLAND_FIELDS)),
    st.builds(lambda n, f: f"islands-{n}-{f}", st.text(max_size=4), st.text(max_size=8)))
# Changes to a valid new-run form: a few of its fields (or island rows) set to any text.
NEW_RUN_CHANGES = st.dictionaries(
    st.one_of(st.sampled_from(["name", "mode", "seed", "initial_checkpoint", *CONFIG_FIELDS]),
              ISLAND_KEY), TEXT, max_size=6)


def client_of(user) -> Client:
    client = Client(raise_request_exception=True)
    client.force_login(user)
    return client


def test_the_new_run_form_never_fails_and_saves_nothing_it_refuses(operator, new_run_form):
    client = client_of(operator)
    base = new_run_form

    @FUZZ
    @given(changes=NEW_RUN_CHANGES)
    @example(changes={"islands-²-name": "a"})  # once a 500
    @example(changes={"data.path": "../../etc/passwd"})
    @example(changes={"model.n_layer": "48", "model.n_embd": "4096"})
    def post(changes):
        before = Run.objects.count()
        response = client.post("/runs/new/", {**base, **changes})
        assert response.status_code in (200, 302), response.status_code
        if response.status_code == 200:  # refused: the form again, with its messages
            assert Run.objects.count() == before
        else:
            assert Run.objects.count() == before + 1

    post()


def test_an_island_index_of_thousands_of_digits_is_ignored_not_a_500(operator, new_run_form):
    """int() refuses a string of over 4,300 digits: such an index once raised."""
    client = client_of(operator)
    data = {**new_run_form, f"islands-{'9' * 5000}-name": "a"}
    response = client.post("/runs/new/", urlencode(data),
                           content_type="application/x-www-form-urlencoded")
    assert response.status_code in (200, 302)


def test_the_simulate_form_never_fails_and_saves_nothing_it_refuses(operator, monkeypatch):
    from webapp.runs.tasks import run_simulation

    monkeypatch.setattr(run_simulation, "apply_async", lambda *args, **kwargs: None)
    client = client_of(operator)

    @FUZZ
    @given(form=st.fixed_dictionaries({}, optional={
        "chips": TEXT, "islands": TEXT, "hours": TEXT, "knobs": TEXT}))
    @example(form={"chips": "1e400", "islands": "1", "hours": "1"})  # once a 500
    def post(form):
        before = Simulation.objects.count()
        response = client.post("/simulate/", form)
        assert response.status_code in (200, 302), response.status_code
        assert Simulation.objects.count() == before + (response.status_code == 302)

    post()


def test_the_tokens_form_never_fails_and_keeps_names_storable(viewer):
    client = client_of(viewer)

    @FUZZ
    @given(name=st.one_of(TEXT, st.text(min_size=90, max_size=300)))
    @example(name="\x00")  # once stored as is, which PostgreSQL refuses
    def post(name):
        response = client.post("/account/tokens/", {"name": name})
        assert response.status_code == 200
        newest = ApiToken.objects.filter(user=viewer).order_by("-id").first()
        assert len(newest.name) <= 100 and "\x00" not in newest.name

    post()


def test_the_sign_in_form_never_fails(django_user_model, settings):
    settings.AXES_FAILURE_LIMIT = 10**6
    django_user_model.objects.create_user("someone", password="a right password 9")
    client = Client(raise_request_exception=True)

    @FUZZ
    @given(form=st.fixed_dictionaries({}, optional={"username": TEXT, "password": TEXT}))
    def post(form):
        response = client.post("/accounts/login/", form)
        assert response.status_code == 200  # the form again: nothing here signs in

    post()


PAGES = ["/", "/runs/new/", "/compare/", "/simulate/"]
QUERY_KEYS = ["sort", "archived", "preset", "from", "runs", "id"]


def test_the_pages_never_fail_whatever_their_query_string(operator):
    client = client_of(operator)

    @FUZZ
    @given(page=st.sampled_from(PAGES),
           query=st.dictionaries(st.sampled_from(QUERY_KEYS), TEXT, max_size=4))
    @example(page="/simulate/", query={"id": "abc"})  # once a 500
    @example(page="/runs/new/", query={"from": "abc"})  # once a 500
    @example(page="/compare/", query={"runs": "²"})  # once a 500
    def get(page, query):
        response = client.get(page, query)
        assert response.status_code == 200, (page, query, response.status_code)

    get()
