"""The spec of a run as syncd follows it (syncd.spec.RunSpec), on a fake store."""

import json
from types import SimpleNamespace

import pytest

from syncd.spec import RunSpec

ISLANDS = [{"name": "a", "region": "us-east"}, {"name": "b", "region": "us-west"}]


def raw(mode="decoupled", islands=ISLANDS) -> bytes:
    return json.dumps({"mode": mode, "config": {"islands": islands},
                       "secret": "ab" * 16}).encode()


def store_with(value: bytes | None):
    store = SimpleNamespace(run_id="7", value=value)
    store.raw_spec = lambda: store.value
    return store


def test_it_reads_the_config_secret_and_mode_of_the_run():
    spec = RunSpec(store_with(raw("elastic")))
    assert spec.island_names() == {"a", "b"}
    assert spec.secret == bytes.fromhex("ab" * 16)
    assert spec.elastic
    assert not RunSpec(store_with(raw())).elastic


def test_a_run_without_a_spec_has_no_spec():
    with pytest.raises(ValueError, match="run 7 has no spec in Redis"):
        RunSpec(store_with(None))


def test_it_follows_the_islands_added_to_a_running_run():
    store = store_with(raw())
    spec = RunSpec(store)
    assert not spec.follow()  # unchanged
    store.value = raw(islands=[*ISLANDS, {"name": "c", "region": "us-east"}])
    assert spec.follow()
    assert spec.island_names() == {"a", "b", "c"}
    store.value = None  # the run's keys are gone: the config stays
    assert not spec.follow()
    assert spec.island_names() == {"a", "b", "c"}
