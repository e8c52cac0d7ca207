"""The spec of a run as syncd follows it (syncd.spec.RunSpec), on a fake store."""

import json
from types import SimpleNamespace

import pytest

from diloco.signing import publish_key, verify_key_hex
from syncd.spec import RunSpec

ISLANDS = [{"name": "a", "region": "us-east"}, {"name": "b", "region": "us-west"}]


def raw(mode="decoupled", islands=ISLANDS) -> bytes:
    return json.dumps({"mode": mode, "config": {"islands": islands},
                       "verify_key": verify_key_hex(SECRET)}).encode()


SECRET = bytes.fromhex("ab" * 16)


def store_with(value: bytes | None, secret: bytes | None = SECRET):
    store = SimpleNamespace(run_id="7", value=value)
    store.raw_spec = lambda: store.value
    store.secret = lambda: secret
    return store


def test_it_reads_the_config_secret_keys_and_mode_of_the_run():
    spec = RunSpec(store_with(raw("elastic")))
    assert spec.island_names() == {"a", "b"}
    assert spec.secret == SECRET
    assert spec.publish_key.private_bytes_raw() == publish_key(SECRET).private_bytes_raw()
    assert spec.verify_key.public_bytes_raw().hex() == verify_key_hex(SECRET)
    assert spec.elastic
    assert not RunSpec(store_with(raw())).elastic


def test_a_run_without_a_secret_in_its_own_key_has_no_spec_for_syncd():
    with pytest.raises(ValueError, match="run 7 has no secret in Redis"):
        RunSpec(store_with(raw(), secret=None))


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
