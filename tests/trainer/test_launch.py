"""The island process's command line and the environment of its ranks."""

import socket

from trainer.launch import (
    CONTROL_PLANE_ENV,
    free_port,
    island_command,
    island_env,
    island_processes,
    rank_env,
)
from webapp.processes import port_is_free


def test_the_island_command_names_the_device_only_for_several_processes():
    one = island_command(7, "a", 2)
    two = island_command(7, "a", 2, device="cuda")

    assert one[-2:] == ["--epoch", "2"]
    assert two == [*one, "--device", "cuda"]


def test_the_processes_and_device_of_an_island_come_from_the_run_spec():
    spec = {"config": {"train": {"device": "cuda"},
                       "islands": [{"name": "a", "processes": 4}, {"name": "b"}]}}

    assert island_processes(spec, "a") == (4, "cuda")
    assert island_processes(spec, "b") == (1, "cuda")
    assert island_processes({"config": {"islands": []}}, "a") == (1, "auto")
    assert island_processes(None, "a") == (1, "auto")


def test_torchrun_style_environment_for_each_rank():
    assert rank_env(1, 2, 29500) == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                                     "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}


def test_free_port_gives_a_port_nothing_listens_on():
    port = free_port()

    assert port_is_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free(port)


def test_an_islands_environment_keeps_its_launchers_but_not_the_control_planes_credentials():
    base = {name: "credential" for name in CONTROL_PLANE_ENV} | {"PATH": "/bin", "HOME": "/h"}

    env = island_env(base)

    assert env == {"PATH": "/bin", "HOME": "/h", "PYTHONUNBUFFERED": "1"}
    assert "SECRET_KEY" in base  # the launcher's own is left alone
