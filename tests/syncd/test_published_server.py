"""syncd's HTTP server of published fragments (syncd.published_server): a merge's full
message is read from syncd's file of it, with the run's read token, and never from a
file that holds another version. Real sockets; the integration tests a real Redis."""

import http.client
import socket
import ssl
from urllib.parse import urlsplit

import pytest
import torch

from diloco.protocol import decode_message
from syncd.bulk import BulkError, ServedRef, load_ref, read_served
from syncd.published_files import PublishedFiles
from syncd.published_server import PublishedServer, parse_address
from tests.certificates import certificates
from tests.syncd.runs import make_run_sync, merge_once

MOMENTUM = {"momentum.w": torch.ones(3)}


@pytest.fixture
def server(tmp_path):
    server = PublishedServer(tmp_path)
    yield server
    server.close()


def get(url: str, headers: dict | None = None) -> int:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    connection.request("GET", parts.path, headers=headers or {})
    status = connection.getresponse().status
    connection.close()
    return status


def test_a_saved_version_is_read_whole_with_the_runs_token(server, tmp_path):
    message = bytes(range(256)) * 4000
    PublishedFiles.of_run(tmp_path, 3).save(1, 7, 5, message, MOMENTUM)
    ref = server.serve("3").ref(1, 7, 5, len(message))

    assert read_served(ref, len(message)) == message
    assert load_ref(ref.dumps()) == ref


def test_a_request_without_the_runs_token_is_refused(server, tmp_path):
    PublishedFiles.of_run(tmp_path, 3).save(0, 1, 0, b"x" * 100, MOMENTUM)
    ref = server.serve("3").ref(0, 1, 0, 100)
    other = server.serve("4")  # another run's token does not open run 3's files

    assert get(ref.url) == 403
    assert get(ref.url, {"Authorization": f"Bearer {other.token}"}) == 403
    with pytest.raises(BulkError, match="403"):
        read_served(ServedRef(ref.url, 100, other.token), 100)


def test_a_run_no_longer_served_is_refused(server, tmp_path):
    PublishedFiles.of_run(tmp_path, 3).save(0, 1, 0, b"x" * 100, MOMENTUM)
    ref = server.serve("3").ref(0, 1, 0, 100)

    server.forget("3")

    with pytest.raises(BulkError, match="403"):
        read_served(ref, 100)


def test_a_file_that_holds_another_version_is_not_served(server, tmp_path):
    files = PublishedFiles.of_run(tmp_path, 3)
    served = server.serve("3")
    files.save(0, 1, 0, b"one" * 10, MOMENTUM)
    files.save(0, 3, 0, b"three" * 10, MOMENTUM)  # version 3 over version 1, in place

    with pytest.raises(BulkError, match="404"):
        read_served(served.ref(0, 1, 0, 30), 100)
    with pytest.raises(BulkError, match="404"):
        read_served(served.ref(0, 2, 0, 30), 100)  # never saved
    with pytest.raises(BulkError, match="404"):
        read_served(served.ref(0, 3, 9, 50), 100)  # another grant's file
    assert read_served(served.ref(0, 3, 0, 50), 100) == b"three" * 10


def test_a_reference_of_another_size_or_over_the_limit_is_refused(server, tmp_path):
    PublishedFiles.of_run(tmp_path, 3).save(0, 1, 0, b"x" * 100, MOMENTUM)
    served = server.serve("3")

    with pytest.raises(BulkError, match="holds 100 bytes"):
        read_served(served.ref(0, 1, 0, 99), 1000)
    with pytest.raises(BulkError, match="exceeds the limit"):
        read_served(served.ref(0, 1, 0, 100), 99)


def test_a_server_that_is_gone_is_a_bulk_error(tmp_path):
    server = PublishedServer(tmp_path)
    ref = server.serve("3").ref(0, 1, 0, 100)
    server.close()

    with pytest.raises(BulkError, match="could not be read"):
        read_served(ref, 100)


def test_a_served_reference_never_shows_its_token():
    ref = ServedRef("http://127.0.0.1:1/published/3/0/1/0", 10, "secret-token")

    assert "secret-token" not in repr(ref)
    with pytest.raises(BulkError, match="http://"):
        load_ref('{"url": "file:///etc/passwd", "size": 1, "token": "t"}')


@pytest.mark.parametrize("address", ["8000", "host:", ":80", "host:99999", "host:port"])
def test_an_address_that_is_not_host_and_port_is_refused_with_its_setting(address):
    with pytest.raises(ValueError, match="SYNCD_SERVE"):
        parse_address(address)


@pytest.mark.integration
@pytest.mark.django_db
def test_a_served_merge_puts_no_full_message_on_the_data_plane_nor_takes_a_slot(
        redis_url, server, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "decoupled", server=server)
    store = sync.store
    publish, slots = store.globals.publish, []
    store.globals.publish = lambda *args, **kwargs: (slots.append(store.updates.slot_holders(2)),
                                                     publish(*args, **kwargs))

    merge_once(sync)

    assert slots == [[]]  # nothing written twice on the data plane: no upload slot taken
    # The references only (full:<fragment>), no chunks (full:<fragment>:<version>:...).
    assert not list(sync.store.data.scan_iter(match=f"{sync.store.prefix}full:*:*"))
    island = type(sync.store)(sync.store.client, sync.store.run_id)  # no server of its own
    _, meta, tensors = decode_message(island.globals.full(0), sync.spec.verify_key)
    assert meta["version"] == 1
    assert all(tensors[n].equal(t) for n, t in sync.rounds.sync.globals[0].items())


@pytest.mark.integration
@pytest.mark.django_db
def test_a_restarted_syncd_serves_the_published_version_from_its_own_server(
        redis_url, tmp_path):
    from syncd.service import RunSync
    from webapp.runs.records import DatabaseRecorder

    first = PublishedServer(tmp_path)
    sync = make_run_sync(redis_url, tmp_path, "decoupled", server=first)
    merge_once(sync)
    merged = sync.store.globals.full(0)
    first.close()  # syncd's process is gone, and its server with it

    second = PublishedServer(tmp_path)
    try:
        store = type(sync.store)(sync.store.client, sync.store.run_id,
                                 served=second.serve(sync.store.run_id))
        again = RunSync(store, DatabaseRecorder(sync.recorder.run_id), tmp_path,
                        clock=lambda: 2000.0)

        assert again.rounds.sync.version(0) == 1
        assert store.globals.full(0) == merged
        assert second.base_url in store.client.get(store.key("full", 0)).decode()
    finally:
        second.close()


@pytest.fixture
def tls_server(tmp_path):
    authority, cert, key = certificates(tmp_path)
    server = PublishedServer(tmp_path / "checkpoints", tls=(cert, key))
    yield server, authority
    server.close()


def test_with_a_certificate_an_island_that_trusts_its_authority_reads_over_https(
        tls_server, tmp_path, monkeypatch):
    server, authority = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", authority)
    message = bytes(range(256)) * 4000
    PublishedFiles.of_run(tmp_path / "checkpoints", 3).save(1, 7, 5, message, MOMENTUM)
    ref = server.serve("3").ref(1, 7, 5, len(message))

    assert ref.url.startswith("https://127.0.0.1:")
    assert read_served(ref, len(message)) == message
    assert load_ref(ref.dumps()) == ref


def test_an_island_that_does_not_trust_the_certificate_reads_nothing(
        tls_server, tmp_path, monkeypatch):
    server, _ = tls_server
    other_authority, _, _ = certificates(tmp_path / "other")
    monkeypatch.setenv("SSL_CERT_FILE", other_authority)
    PublishedFiles.of_run(tmp_path / "checkpoints", 3).save(0, 1, 0, b"x" * 100, MOMENTUM)
    ref = server.serve("3").ref(0, 1, 0, 100)

    with pytest.raises(BulkError, match="CERTIFICATE_VERIFY_FAILED"):
        read_served(ref, 100)


def test_a_plain_http_request_to_the_https_port_gets_no_fragment(tls_server, tmp_path):
    server, _ = tls_server
    PublishedFiles.of_run(tmp_path / "checkpoints", 3).save(0, 1, 0, b"x" * 100, MOMENTUM)
    ref = server.serve("3").ref(0, 1, 0, 100)
    plain = ServedRef(ref.url.replace("https://", "http://"), 100, ref.token)

    with pytest.raises(BulkError, match="could not be read"):
        read_served(plain, 100)


def test_a_client_that_never_finishes_its_handshake_holds_up_no_other(
        tls_server, tmp_path, monkeypatch):
    server, authority = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", authority)
    PublishedFiles.of_run(tmp_path / "checkpoints", 3).save(0, 1, 0, b"x" * 100, MOMENTUM)
    ref = server.serve("3").ref(0, 1, 0, 100)
    parts = urlsplit(ref.url)

    with socket.create_connection((parts.hostname, parts.port)):  # connects, says nothing
        assert read_served(ref, 100) == b"x" * 100


def test_a_certificate_without_its_key_is_refused_at_the_start(tmp_path):
    _, cert, _ = certificates(tmp_path)
    _, _, other_key = certificates(tmp_path / "other")

    with pytest.raises(ssl.SSLError):
        PublishedServer(tmp_path, tls=(cert, other_key))
