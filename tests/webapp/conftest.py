"""Fixtures of the web app's tests: users and clients, island tasks recorded instead of
sent, the data roots and a data folder, the demo form's post and a process manager, from
tests/fixtures.py."""

from tests.fixtures import (  # noqa: F401 - fixtures, found by name
    _data_roots,
    admin,
    admin_client,
    data_root,
    enqueued,
    manager,
    new_run_form,
    operator,
    operator_client,
    viewer,
    viewer_client,
)
