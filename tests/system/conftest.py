"""Fixtures of the scenario tests that span the whole system: the web app's users and
clients, its data roots and the demo form's post, and a whole system of its own, from
tests/fixtures.py."""

from tests.fixtures import (  # noqa: F401 - fixtures, found by name
    _data_roots,
    admin,
    admin_client,
    new_run_form,
    operator,
    system,
    viewer,
)
