"""Hostile and broken updates against syncd's live ingestion (syncd/ingest.py's checks,
in RunSync on a real Redis and the real database).

Each bad message is written into the run's stream as an attacker (or a broken island)
could. One not shown to be the island's (unsigned, torn, another's) is quarantined: a
rejection event, and nothing done in the island's name, whose genuine update of the
same seq still merges. One the island signed is rejected with a reason, counted for
its island (the status the control room shows), recorded as a rejection event and
never merged. Either way the run goes on: the next good updates merge into a new
version.
"""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
from safetensors.torch import save as save_tensors

from diloco import codecs
from diloco.protocol import PROTOCOL_VERSION, encode_message
from diloco.signing import island_key
from syncd.bulk import BulkRef
from syncd.ingest import NORM_WARMUP, IslandFacts, all_finite, check_update, message_limit
from syncd.service import RunSync
from syncd.store import RunStore
from syncd.update_stream import UpdateRef
from tests.fixtures import tagged
from tests.syncd import runs
from webapp.runs.models import Event
from webapp.runs.records import DatabaseRecorder

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

# A lag of up to 4 versions is allowed, so that stale updates are only the ones meant to be.
CONFIG = {**runs.CONFIG, "sync": {**runs.CONFIG["sync"], "max_staleness": 4}}
STEPS = 4


@pytest.fixture
def run_sync(redis_url, tmp_path) -> RunSync:
    sync = runs.make_run_sync(redis_url, tmp_path, "decoupled", config=CONFIG)
    runs.heartbeat_all(sync)
    return sync


def meta_of(sync: RunSync, island: str, seq: int, **changes) -> dict:
    return {"run": sync.store.run_id, "island": island, "epoch": 1, "fragment": 0,
            "base_version": sync.rounds.sync.version(0), "seq": seq,
            "tokens": STEPS * runs.TOKENS_PER_STEP, "inner_steps": STEPS, "compute_s": 1.0,
            "codec": "none", **changes}


def tensors_of(sync: RunSync, value: float = 0.01, dtype=torch.float32) -> dict:
    return {n: torch.full(s, value, dtype=dtype) for n, s in sync.rounds.sync.shapes[0].items()}


def good_blob(sync: RunSync, island: str, seq: int, value: float = 0.01) -> bytes:
    return encode_message("update", meta_of(sync, island, seq), tensors_of(sync, value),
                          key_of(sync, island))


def key_of(sync: RunSync, island: str, epoch: int = 1) -> bytes:
    """The key the control plane gives that island's epoch."""
    return island_key(sync.spec.secret, island, epoch)


def push(sync: RunSync, island: str, seq: int, blob: bytes) -> None:
    sync.store.updates.push_update(island, 1, 0, seq, blob)


def rejection_reasons(sync: RunSync) -> list[str]:
    sync.recorder.flush()
    return [e.detail["reason"] for e in Event.objects.filter(run_id=sync.recorder.run_id,
                                                             kind="rejection")]


# -- the hostile messages: (name, blob maker, words of the reason) --------------------

def truncated(sync):
    blob = good_blob(sync, "a", 8)
    return blob[:len(blob) // 2]


def a_few_bytes(sync):
    return b"\x01\x02\x03"


def not_safetensors(sync):
    return tagged(b"this is not a safetensors message, whatever its length says", key_of(sync, "a"))


def bad_header_json(sync):
    header = b"{not json"
    return tagged(struct.pack("<Q", len(header)) + header, key_of(sync, "a"))


def header_of(sync, entry: dict, meta: dict | None = None) -> bytes:
    """A signed message whose safetensors header holds `entry` as its one tensor."""
    header = json.dumps({"__metadata__": meta if meta is not None else {"x": "y"},
                         "t": entry}).encode()
    return tagged(struct.pack("<Q", len(header)) + header, key_of(sync, "a"))


def shape_past_any_number(sync):
    return header_of(sync, {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 0]})


def empty_tensor_of_absurd_shape(sync):
    return header_of(sync, {"dtype": "F32", "shape": [0, 10**30], "data_offsets": [0, 0]})


def no_metadata(sync):
    return header_of(sync, {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, meta={})


def wrong_dtype(sync):
    return encode_message("update", meta_of(sync, "a", 8),
                          tensors_of(sync, dtype=torch.float64), key_of(sync, "a"))


def wrong_shape(sync):
    # The same number of values, transposed: it would reshape silently into garbage.
    tensors = {n: t.reshape(*reversed(t.shape)) if t.dim() == 2 and t.shape[0] != t.shape[1]
               else t for n, t in tensors_of(sync).items()}
    assert any(t.shape != sync.rounds.sync.shapes[0][n] for n, t in tensors.items())
    return encode_message("update", meta_of(sync, "a", 8), tensors, key_of(sync, "a"))


def wrong_names(sync):
    return encode_message("update", meta_of(sync, "a", 8),
                          {"lm_head.nonsense": torch.zeros(3, 3)}, key_of(sync, "a"))


def with_nan(sync):
    return good_blob(sync, "a", 8, value=math.nan)


def with_inf(sync):
    return good_blob(sync, "a", 8, value=math.inf)


def with_minus_inf_in_int8_scale(sync):
    payload = codecs.encode(tensors_of(sync), "int8")
    name = next(k for k in payload if k.endswith(":scale"))
    payload[name] = torch.full_like(payload[name], -math.inf)
    return encode_message("update", meta_of(sync, "a", 8, codec="int8"), payload, key_of(sync, "a"))


def huge(sync):
    tensors = tensors_of(sync)
    tensors["padding"] = torch.zeros(message_limit(sync.rounds.sync.shapes[0]) // 4 + 1)
    return encode_message("update", meta_of(sync, "a", 8), tensors, key_of(sync, "a"))


def another_runs_secret(sync):
    return encode_message("update", meta_of(sync, "a", 8), tensors_of(sync),
                          island_key(b"the secret of another run", "a", 1))


def unsigned(sync):
    header = {"protocol": str(PROTOCOL_VERSION), "kind": "update",
              **{k: json.dumps(v) for k, v in meta_of(sync, "a", 8).items()}}
    return save_tensors(tensors_of(sync), metadata=header)


def claims_another_island(sync):
    return encode_message("update", meta_of(sync, "b", 8), tensors_of(sync), key_of(sync, "a"))


def absurd_inner_steps(sync):
    steps = 10**12
    return encode_message("update", meta_of(sync, "a", 8, inner_steps=steps,
                                            tokens=steps * runs.TOKENS_PER_STEP),
                          tensors_of(sync), key_of(sync, "a"))


def base_version_not_a_number(sync):
    return encode_message("update", meta_of(sync, "a", 8, base_version="latest"),
                          tensors_of(sync), key_of(sync, "a"))


def wrong_token_count(sync):
    return encode_message("update", meta_of(sync, "a", 8, tokens=10**9), tensors_of(sync),
                          key_of(sync, "a"))


def a_global_message(sync):
    meta = {"run": sync.store.run_id, "fragment": 0, "version": 9, "base_version": -1,
            "codec": "none"}
    return encode_message("global", meta, tensors_of(sync), sync.spec.publish_key)


def signed_by_another_island(sync):
    return encode_message("update", meta_of(sync, "a", 8), tensors_of(sync), key_of(sync, "b"))


def signed_with_another_epochs_key(sync):
    return encode_message("update", meta_of(sync, "a", 8), tensors_of(sync),
                          key_of(sync, "a", epoch=2))


def signed_with_the_runs_secret(sync):
    return encode_message("update", meta_of(sync, "a", 8), tensors_of(sync), sync.spec.secret)


# Entries whose message is not shown to be the update they claim: they speak for no
# island, and are quarantined (syncd/quarantine.py).
UNVERIFIED = [
    (truncated, "bad signature"),
    (a_few_bytes, "truncated"),
    (not_safetensors, "does not fit the message"),
    (bad_header_json, "not a safetensors message"),
    (shape_past_any_number, "not a safetensors message"),
    (empty_tensor_of_absurd_shape, "not a safetensors message"),
    (no_metadata, "protocol version"),
    (huge, "past the run's largest update"),
    (another_runs_secret, "bad signature"),
    (unsigned, "bad signature"),
    (claims_another_island, "does not match the stream entry"),
    (a_global_message, "bad signature"),
    (signed_by_another_island, "bad signature"),
    (signed_with_another_epochs_key, "bad signature"),
    (signed_with_the_runs_secret, "bad signature"),
]
# Signed with the island's own key: refused as the island's.
REFUSED = [
    (wrong_dtype, "torch.float64"),
    (wrong_shape, "has shape"),
    (wrong_names, "do not match the fragment"),
    (with_nan, "non-finite"),
    (with_inf, "non-finite"),
    (with_minus_inf_in_int8_scale, "non-finite"),
    (absurd_inner_steps, "more than the island's seq"),
    (base_version_not_a_number, "base_version must be a whole number"),
    (wrong_token_count, "do not match"),
]


def assert_rejected_and_the_run_goes_on(sync: RunSync, reason: str, seq: int) -> None:
    """One rejection of island a with `reason`, counted and shown; b's good update waits
    alone; a's next good update merges with it into a new version."""
    reasons = rejection_reasons(sync)
    assert len(reasons) == 1 and reason in reasons[0], reasons
    assert sync.rounds.ingester.rejections == {"a": 1}
    assert sync.status(1000.0)["islands"]["a"]["rejections"] == 1
    version = sync.rounds.sync.version(0)
    assert sync.store.globals.versions()[0] == version
    assert list(sync.rounds.sync.open_round(0)) == ["b"]

    push(sync, "a", seq + STEPS, good_blob(sync, "a", seq + STEPS))
    sync.tick()

    assert sync.store.globals.versions()[0] == version + 1
    assert all(torch.isfinite(t).all() for t in sync.rounds.sync.globals[0].values())
    assert sync.rounds.ingester.rejections == {"a": 1}


def assert_quarantined_and_the_run_goes_on(sync: RunSync, reason: str, seq: int) -> None:
    """One rejection event with `reason`, and nothing done in island a's name: nothing
    counted, handled or booked as lost, the entry gone from the stream (b's too: folded
    into the round, it is done with); b's good update waits alone, and a's genuine
    update of that very seq merges with it."""
    reasons = rejection_reasons(sync)
    assert len(reasons) == 1 and reason in reasons[0], reasons
    assert sync.rounds.ingester.rejections == {}
    assert sync.status(1000.0)["islands"]["a"]["rejections"] == 0
    assert "a" not in sync.store.globals.handled(0)
    assert sum(sync.accounting.islands["a"].lost.values()) == 0.0
    entries = sync.store.client.xrange(sync.store.key("updates"))
    assert entries == []
    version = sync.rounds.sync.version(0)
    assert sync.store.globals.versions()[0] == version
    assert list(sync.rounds.sync.open_round(0)) == ["b"]

    push(sync, "a", seq, good_blob(sync, "a", seq))
    sync.tick()

    assert sync.store.globals.versions()[0] == version + 1
    assert sync.rounds.ingester.rejections == {}


@pytest.mark.parametrize("make, reason", UNVERIFIED, ids=[m.__name__ for m, _ in UNVERIFIED])
def test_an_unverified_update_is_quarantined_and_the_islands_genuine_one_still_merges(
        run_sync, make, reason):
    push(run_sync, "a", 8, make(run_sync))
    push(run_sync, "b", 8, good_blob(run_sync, "b", 8))

    run_sync.tick()

    assert_quarantined_and_the_run_goes_on(run_sync, reason, 8)


@pytest.mark.parametrize("make, reason", REFUSED, ids=[m.__name__ for m, _ in REFUSED])
def test_a_hostile_update_is_rejected_counted_and_never_merged(run_sync, make, reason):
    push(run_sync, "a", 8, make(run_sync))
    push(run_sync, "b", 8, good_blob(run_sync, "b", 8))

    run_sync.tick()

    assert_rejected_and_the_run_goes_on(run_sync, reason, 8)


def test_an_update_of_an_absurd_norm_is_rejected_once_recent_norms_are_known(run_sync):
    seq = 0
    while len(run_sync.rounds.ingester.norms[0]) < NORM_WARMUP:
        seq += STEPS
        push(run_sync, "a", seq, good_blob(run_sync, "a", seq))
        push(run_sync, "b", seq, good_blob(run_sync, "b", seq))
        run_sync.tick()
    seq += STEPS
    push(run_sync, "a", seq, good_blob(run_sync, "a", seq, value=1e6))
    push(run_sync, "b", seq, good_blob(run_sync, "b", seq))

    run_sync.tick()

    assert_rejected_and_the_run_goes_on(run_sync, "exceeds", seq)


def test_an_update_sent_again_is_the_same_update_merged_once_and_refused_nothing(run_sync):
    blob = good_blob(run_sync, "a", 4)
    push(run_sync, "a", 4, blob)
    push(run_sync, "b", 4, good_blob(run_sync, "b", 4))
    run_sync.tick()
    assert run_sync.store.globals.versions()[0] == 1

    push(run_sync, "a", 4, blob)  # the very same signed bytes again
    push(run_sync, "b", 8, good_blob(run_sync, "b", 8))
    run_sync.tick()

    assert rejection_reasons(run_sync) == []
    assert run_sync.rounds.ingester.rejections == {}
    assert run_sync.store.globals.versions()[0] == 1
    assert list(run_sync.rounds.sync.open_round(0)) == ["b"]
    assert runs.stored_keys(run_sync.store, "blob") == []  # the copy is deleted unread


def test_a_restarted_syncd_reads_handled_updates_again_without_calling_them_replays(
        run_sync, tmp_path):
    push(run_sync, "a", 4, good_blob(run_sync, "a", 4))
    push(run_sync, "b", 4, good_blob(run_sync, "b", 4))
    run_sync.tick()
    run_sync.recorder.flush()

    again = RunSync(run_sync.store, DatabaseRecorder(run_sync.store.run_id), tmp_path,
                    clock=lambda: 1001.0, control_every_s=0.0)
    again.tick()

    assert again.rounds.ingester.rejections == {}
    assert rejection_reasons(again) == []
    assert again.store.globals.versions()[0] == 1


# -- a message in chunks (syncd.bulk), tampered with in Redis --------------------------

# Tampered as an island writes chunks, with their TTL (one without is deleted at syncd's
# next look, before it is read: syncd/key_bounds.py).
def swap_chunks(store: RunStore, keys: list[str]) -> None:
    first, second = store.client.get(keys[0]), store.client.get(keys[1])
    store.client.set(keys[0], second, keepttl=True)
    store.client.set(keys[1], first, keepttl=True)


def forge_chunk(store: RunStore, keys: list[str]) -> None:
    chunk = bytearray(store.client.get(keys[1]))
    chunk[10] ^= 0xFF
    store.client.set(keys[1], bytes(chunk), keepttl=True)


def drop_chunk(store: RunStore, keys: list[str]) -> None:
    store.client.delete(keys[1])


@pytest.mark.parametrize("tamper, reason", [
    (swap_chunks, "bad signature"),
    (forge_chunk, "bad signature"),
    (drop_chunk, "chunk 2 of"),
], ids=["reordered", "forged", "missing"])
def test_a_tampered_chunk_gets_its_update_quarantined_and_never_merged(run_sync, tamper,
                                                                       reason):
    push(run_sync, "a", 8, good_blob(run_sync, "a", 8))
    [ref] = run_sync.store.updates.read_updates()
    assert ref.blob.chunks >= 2, "the tests' chunk size (tests/conftest.py) splits updates"
    tamper(run_sync.store, ref.blob.chunk_keys())
    push(run_sync, "b", 8, good_blob(run_sync, "b", 8))

    run_sync.tick()

    assert_quarantined_and_the_run_goes_on(run_sync, reason, 8)
    assert not list(run_sync.store.client.scan_iter(match=run_sync.store.key("blob") + "*"))


@pytest.mark.parametrize(("values", "finite"), [
    ([1.0, -2.0, 3.0], True),
    ([1e30, 1e30], True),  # finite, though their squares overflow float32
    ([1.0, math.nan], False),
    ([1.0, math.inf], False),
    ([-math.inf, 0.0], False),
])
def test_all_finite_tells_non_finite_values_from_finite_ones_whose_squares_overflow(
        values, finite):
    tensor = torch.tensor(values)

    assert all_finite([torch.zeros(3), tensor]) is finite


def test_a_checked_update_carries_the_norms_its_check_measured_for_the_fold():
    delta = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0])}
    ref = UpdateRef(b"1-0", "a", 1, 0, 8, BulkRef("k", 1, 1))
    meta = {"codec": "none", "inner_steps": 2, "tokens": 2 * 16, "base_version": 0}

    update, per_step = check_update(meta, delta, ref, IslandFacts(1, 16),
                                    {"w": (2,), "b": (1,)}, [])

    assert update.norms == {"w": 5.0, "b": 1.0}
    assert per_step == pytest.approx(math.sqrt(26) / 2)
