import hashlib
import hmac
import json
import struct

import blake3
import pytest
import torch
from safetensors.torch import save as save_tensors

from diloco.protocol import (
    PROTOCOL_VERSION,
    SIGNATURE_BYTES,
    TAG_BYTES,
    ProtocolError,
    decode_message,
    encode_message,
    encode_pieces,
)
from diloco.signing import (
    island_key,
    load_verify_key,
    publish_key,
    redis_password,
    verify_key_hex,
)
from tests.fixtures import tagged

RUN_SECRET = b"run-7-secret"
SECRET = island_key(RUN_SECRET, "island-1", 2)  # the key of the island UPDATE_META names
PUBLISH = publish_key(RUN_SECRET)
VERIFY = load_verify_key(verify_key_hex(RUN_SECRET))
UPDATE_META = {"run": "run-7", "island": "island-1", "epoch": 2, "fragment": 3,
               "base_version": 11, "seq": 450, "tokens": 4096, "inner_steps": 8,
               "compute_s": 12.5, "codec": "int4"}
GLOBAL_META = {"run": "run-7", "fragment": 0, "version": 12, "base_version": 11,
               "codec": "none"}


def update_blob() -> bytes:
    tensors = {"w:q": torch.arange(32, dtype=torch.uint8), "w:scale": torch.tensor([0.5])}
    return encode_message("update", UPDATE_META, tensors, SECRET)


def test_an_update_survives_the_round_trip():
    tensors = {"w:q": torch.arange(32, dtype=torch.uint8), "w:scale": torch.tensor([0.5])}

    kind, meta, out = decode_message(encode_message("update", UPDATE_META, tensors, SECRET),
                                     SECRET)

    assert kind == "update"
    assert meta == UPDATE_META
    assert out.keys() == tensors.keys()
    assert all(torch.equal(out[n], tensors[n]) and out[n].dtype == tensors[n].dtype
               for n in tensors)


@pytest.mark.parametrize("kind, meta, key", [("update", UPDATE_META, SECRET),
                                             ("global", GLOBAL_META, PUBLISH)])
def test_a_message_in_pieces_is_the_message_encode_message_makes(kind, meta, key):
    tensors = {"a": torch.randn(8, 4), "b": torch.arange(5, dtype=torch.uint8),
               "empty": torch.zeros(0)}

    pieces = encode_pieces(kind, meta, tensors, key)

    assert b"".join(pieces) == encode_message(kind, meta, tensors, key)


def test_the_pieces_of_a_message_are_views_of_its_tensors_not_copies():
    tensors = {"w": torch.zeros(16)}
    pieces = encode_pieces("global", GLOBAL_META, tensors, PUBLISH)

    tensors["w"][0] = 1.0

    assert bytes(pieces[1][:4]) == struct.pack("<f", 1.0)


def test_a_global_message_survives_the_round_trip():
    tensors = {"blocks.0.mlp.c_fc.weight": torch.randn(8, 4), "ln_f.bias": torch.randn(4)}

    kind, meta, out = decode_message(encode_message("global", GLOBAL_META, tensors, PUBLISH),
                                     VERIFY)

    assert kind == "global"
    assert meta == GLOBAL_META
    assert all(torch.equal(out[n], tensors[n]) for n in tensors)


def test_it_refuses_to_encode_a_message_without_its_required_metadata():
    meta = {k: v for k, v in UPDATE_META.items() if k != "epoch"}

    with pytest.raises(ValueError, match="missing \\['epoch'\\]"):
        encode_message("update", meta, {}, SECRET)
    with pytest.raises(ValueError, match="'merge' message"):
        encode_message("merge", GLOBAL_META, {}, SECRET)


@pytest.mark.parametrize("position", [0, 9, -TAG_BYTES - 1, -1])
def test_it_rejects_a_message_with_a_flipped_byte(position):
    blob = bytearray(update_blob())
    blob[position] ^= 0x01

    with pytest.raises(ProtocolError, match="bad signature"):
        decode_message(bytes(blob), SECRET)


def test_it_rejects_an_update_signed_with_another_islands_key():
    blob = encode_message("update", UPDATE_META, {"x": torch.ones(2)},
                          island_key(RUN_SECRET, "island-2", 2))

    with pytest.raises(ProtocolError, match="not signed with the key of the island"):
        decode_message(blob, SECRET)


def test_the_island_keys_differ_by_island_epoch_and_run():
    keys = {island_key(RUN_SECRET, "island-1", 2), island_key(RUN_SECRET, "island-1", 3),
            island_key(RUN_SECRET, "island-2", 2), island_key(b"run-8-secret", "island-1", 2)}
    assert len(keys) == 4 and RUN_SECRET not in keys


def test_the_redis_password_of_a_runs_island_user_is_its_own_and_no_island_key():
    password = redis_password(RUN_SECRET)
    assert password == redis_password(RUN_SECRET) != redis_password(b"run-8-secret")
    assert len(password) == 64 and password != island_key(RUN_SECRET, "island-1", 1).hex()
    assert RUN_SECRET.hex() not in password


def test_it_rejects_a_global_signed_with_another_runs_publish_key():
    blob = encode_message("global", GLOBAL_META, {"x": torch.ones(2)},
                          publish_key(b"run-8-secret"))

    with pytest.raises(ProtocolError, match="not signed with this run's publish key"):
        decode_message(blob, VERIFY)


@pytest.mark.parametrize("position", [0, 9, -SIGNATURE_BYTES - 1, -1])
def test_it_rejects_a_global_with_a_flipped_byte(position):
    blob = encode_message("global", GLOBAL_META, {"x": torch.ones(2)}, PUBLISH)
    blob[position] ^= 0x01

    with pytest.raises(ProtocolError, match="bad signature"):
        decode_message(blob, VERIFY)


def test_a_global_forged_with_an_islands_key_or_the_runs_secret_is_refused():
    """What an island holds (its key) cannot make a global the others accept; nor
    could the run's secret as an HMAC key (the old downlink)."""
    genuine = encode_message("global", GLOBAL_META, {"x": torch.ones(2)}, PUBLISH)
    body = bytes(genuine[:-SIGNATURE_BYTES])
    tags = (blake3.blake3(body, key=SECRET).digest(),
            hmac.new(RUN_SECRET, body, hashlib.sha256).digest())
    for tag in tags:
        for forged in (body + tag, body + tag + tag):
            with pytest.raises(ProtocolError, match="bad signature"):
                decode_message(forged, VERIFY)
    with pytest.raises(ValueError, match="signed with the publish key"):
        encode_message("global", GLOBAL_META, {"x": torch.ones(2)}, SECRET)


def test_an_updates_tag_is_the_blake3_hash_of_its_body_keyed_with_the_island_key():
    blob = update_blob()
    body = bytes(blob[:-TAG_BYTES])

    assert bytes(blob[-TAG_BYTES:]) == blake3.blake3(body, key=SECRET).digest()


def test_a_globals_signature_is_the_publish_keys_over_the_blake3_digest_of_its_body():
    blob = encode_message("global", GLOBAL_META, {"x": torch.ones(2)}, PUBLISH)
    body = bytes(blob[:-SIGNATURE_BYTES])

    VERIFY.verify(bytes(blob[-SIGNATURE_BYTES:]), blake3.blake3(body).digest())


def test_a_protocol_1_update_tagged_with_hmac_sha256_is_refused():
    body = bytes(update_blob()[:-TAG_BYTES])

    with pytest.raises(ProtocolError, match="bad signature"):
        decode_message(body + hmac.new(SECRET, body, hashlib.sha256).digest(), SECRET)


def test_an_update_key_that_is_not_32_bytes_is_refused_on_both_sides():
    with pytest.raises(ValueError, match="an island key is 32 bytes"):
        encode_message("update", UPDATE_META, {}, RUN_SECRET)
    with pytest.raises(ValueError, match="an island key is 32 bytes"):
        decode_message(update_blob(), SECRET[:16])


def test_a_global_is_never_read_as_an_update_nor_an_update_as_a_global():
    with pytest.raises(ProtocolError, match="bad signature"):
        decode_message(encode_message("global", GLOBAL_META, {}, PUBLISH), SECRET)
    with pytest.raises(ProtocolError, match="bad signature"):
        decode_message(update_blob(), VERIFY)


@pytest.mark.parametrize("length", [0, 8 + TAG_BYTES - 1])
def test_it_rejects_a_truncated_message(length):
    with pytest.raises(ProtocolError, match="truncated"):
        decode_message(update_blob()[:length], SECRET)


def test_it_rejects_a_message_cut_short_even_with_room_for_a_tag():
    with pytest.raises(ProtocolError):
        decode_message(update_blob()[:-10], SECRET)


def test_it_rejects_correctly_signed_bytes_that_are_not_safetensors():
    garbage = tagged(b"\x00" * 7 + b"\xff" + b"this is not a tensor file at all", SECRET)

    with pytest.raises(ProtocolError, match="does not fit"):
        decode_message(garbage, SECRET)


def test_it_rejects_a_correctly_signed_header_that_is_not_json():
    header = b"{not json at all"
    body = struct.pack("<Q", len(header)) + header + b"\x00" * 16

    with pytest.raises(ProtocolError, match="not a safetensors message"):
        decode_message(tagged(body, SECRET), SECRET)


def test_it_rejects_a_correctly_signed_header_nested_too_deep_as_a_protocol_error():
    header = b"[" * 200_000
    body = struct.pack("<Q", len(header)) + header

    with pytest.raises(ProtocolError, match="not a safetensors message"):
        decode_message(tagged(body, SECRET), SECRET)


def test_it_rejects_metadata_nested_too_deep_as_a_protocol_error():
    header = {"protocol": str(PROTOCOL_VERSION), "kind": "update",
              **{k: json.dumps(v) for k, v in UPDATE_META.items()}, "seq": "[" * 200_000}
    body = save_tensors({"x": torch.ones(2)}, metadata=header)

    with pytest.raises(ProtocolError, match="metadata is missing or malformed"):
        decode_message(tagged(body, SECRET), SECRET)


def test_it_rejects_another_protocol_version():
    header = {"protocol": str(PROTOCOL_VERSION + 1), "kind": "update",
              **{k: json.dumps(v) for k, v in UPDATE_META.items()}}
    body = save_tensors({"x": torch.ones(2)}, metadata=header)

    with pytest.raises(ProtocolError, match=f"protocol version '{PROTOCOL_VERSION + 1}'"):
        decode_message(tagged(body, SECRET), SECRET)


def test_it_rejects_a_message_of_an_unknown_kind():
    header = {"protocol": str(PROTOCOL_VERSION), "kind": "rollback"}
    body = save_tensors({"x": torch.ones(2)}, metadata=header)

    with pytest.raises(ProtocolError, match="unknown message kind 'rollback'"):
        decode_message(tagged(body, SECRET), SECRET)


def test_it_rejects_a_message_with_malformed_metadata():
    header = {"protocol": str(PROTOCOL_VERSION), "kind": "update",
              **{k: json.dumps(v) for k, v in UPDATE_META.items()}, "seq": "{"}
    body = save_tensors({"x": torch.ones(2)}, metadata=header)

    with pytest.raises(ProtocolError, match="metadata is missing or malformed"):
        decode_message(tagged(body, SECRET), SECRET)


def test_it_rejects_a_message_over_the_size_limit_before_checking_it():
    blob = update_blob()

    with pytest.raises(ProtocolError, match=f"{len(blob)} bytes exceeds the limit"):
        decode_message(blob, SECRET, max_bytes=len(blob) - 1)
    assert decode_message(blob, SECRET, max_bytes=len(blob))[0] == "update"
