"""`manage.py syncd --health`: the container health check of syncd, 0 while a syncd of
this host announces itself in Redis, 1 otherwise, 2 with a sentence when Redis cannot be
reached. (The syncd it starts is syncd/server.py's, tested in tests/syncd/test_server.py.)"""

import socket

import pytest
from django.core.management import call_command

from syncd import lease
from syncd.connection import connect
from trainer.launch import free_port

pytestmark = pytest.mark.integration


def health() -> int:
    """The command's exit status (it returns, rather than exits, on 0)."""
    try:
        call_command("syncd", "--health")
    except SystemExit as exited:
        return exited.code
    return 0


def test_the_health_check_fails_while_no_syncd_announces_itself(redis_url):
    assert health() == 1


def test_the_health_check_fails_while_only_a_syncd_of_another_host_serves(redis_url):
    lease.register(connect(redis_url), "another-host:1:abcdef", ttl_s=30)

    assert health() == 1


def test_the_health_check_passes_while_a_syncd_of_this_host_serves(redis_url):
    client = connect(redis_url)
    owner = lease.new_owner()
    assert owner.startswith(f"{socket.gethostname()}:")
    lease.register(client, owner, ttl_s=30)

    assert health() == 0

    lease.leave(client, owner)
    assert health() == 1


def test_the_health_check_fails_when_the_announcement_has_expired(redis_url):
    lease.register(connect(redis_url), f"{socket.gethostname()}:1:abcdef", ttl_s=0.001)

    assert health() == 1


def test_without_a_redis_it_exits_2_with_a_sentence(settings, capsys):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there

    assert health() == 2
    assert capsys.readouterr().err.startswith("syncd cannot start: ")
