"""compose.yaml, checked without a Docker engine: every command is one the project
has, and every variable is one it reads.

The file is parsed as Compose would see it, with ${VAR}, ${VAR:-default} and
${VAR:?message} filled in from a sample environment.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import dj_database_url
import pytest
import redis
import yaml

from syncd import environment

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_ENV = {
    "SECRET_KEY": "sample-Kq7vX2mZp9Lr4Tw8Yb3Nc6Hd1Jf5Gs0Ae-for-the-compose-test",
    "POSTGRES_PASSWORD": "pg-pw", "REDIS_PASSWORD": "redis-pw"}
# Variables the images themselves read, not the project.
IMAGE_VARIABLES = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "REDISCLI_AUTH"}
APP_SERVICES_MIN = {"migrate", "web", "syncd", "worker-control"}
VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\?)([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Fill in variables as Compose does (the forms compose.yaml uses)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def fill(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, form, arg = match.groups()
        if env.get(name):
            return env[name]
        if form == ":?":
            raise KeyError(f"{name} is required: {arg}")
        return arg or ""

    return VARIABLE.sub(fill, value)


def load_compose(env: dict[str, str] = SAMPLE_ENV) -> dict[str, Any]:
    return interpolate(yaml.safe_load((ROOT / "compose.yaml").read_text()), env)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run Archipelago's own image."""
    return {name: s for name, s in compose["services"].items()
            if str(s.get("image", "")).startswith("archipelago")}


def regions(compose: dict[str, Any]) -> list[str]:
    return compose["services"]["web"]["environment"]["REGIONS"].split(",")


def project_environment_names() -> set[str]:
    """Every environment variable the project reads: those syncd/environment.py names."""
    return environment.SETTINGS | environment.HANDED


def test_it_requires_the_secrets_instead_of_shipping_defaults():
    for missing in SAMPLE_ENV:
        with pytest.raises(KeyError, match=missing):
            load_compose({k: v for k, v in SAMPLE_ENV.items() if k != missing})


def test_it_has_the_services_with_a_worker_for_every_region(compose):
    services = compose["services"]
    assert {"postgres", "redis", "dataplane"} | APP_SERVICES_MIN <= set(services)
    assert {"us-east", "us-central", "us-west", "us-south"} <= set(regions(compose))
    for region in regions(compose):
        assert f"worker-{region}" in services, f"no worker for region {region}"
    assert services["worker-gpu"]["profiles"] == ["gpu"]
    gpu = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]


def test_every_long_running_service_has_a_health_check_and_a_restart_policy(compose):
    for name, service in compose["services"].items():
        if name == "migrate":
            assert service["restart"] == "no"  # a one-shot job
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        assert service.get("restart") == "unless-stopped", name


def test_the_app_waits_for_healthy_services_and_shares_the_checkpoint_volume(compose):
    for name, service in app_services(compose).items():
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", name
        if name != "migrate":
            assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
            assert (service["depends_on"]["migrate"]["condition"]
                    == "service_completed_successfully")
        checkpoint_dir = service["environment"]["CHECKPOINT_DIR"]
        assert f"checkpoints:{checkpoint_dir}" in service["volumes"], name
    assert "checkpoints" in compose["volumes"]


def check_command(argv: list[str], compose: dict[str, Any]) -> None:
    """Fail unless argv runs something the project has, with options it accepts."""
    from trainer.queues import CONTROL_QUEUE, region_queue

    program, *args = argv
    if program == "python" and args[0] == "manage.py":
        from django.core.management import get_commands, load_command_class

        assert (ROOT / "manage.py").exists()
        commands = get_commands()
        assert args[1] in commands, f"manage.py has no command {args[1]}"
        command = load_command_class(commands[args[1]], args[1])
        command.create_parser("manage.py", args[1]).parse_args(args[2:])
    elif program == "python" and args[0] == "-c":
        compile(args[1], "<healthcheck>", "exec")
    elif program == "daphne":
        from daphne.cli import CommandLineInterface

        parsed = CommandLineInterface().parser.parse_args(args)
        module, attribute = parsed.application.split(":")
        assert getattr(importlib.import_module(module), attribute)
    elif program == "celery":
        from celery.bin.celery import celery

        assert args[:2] == ["-A", "webapp"]
        assert importlib.import_module("webapp.celery").app.main == "archipelago"
        command = celery.commands[args[2]]
        rest = args[3:]
        if args[2] == "inspect":
            assert rest[0] == "ping"
            rest = rest[1:]
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        assert {a for a in rest if a.startswith("-")} <= options, (argv, options)
        if args[2] == "worker":
            queue = rest[rest.index("-Q") + 1]
            queues = {CONTROL_QUEUE} | {region_queue(r) for r in regions(compose)}
            assert queue in queues, f"nothing sends islands to queue {queue}"
            name = rest[rest.index("-n") + 1]
            assert name.endswith("@%h")
            size = "--concurrency" if "--concurrency" in rest else "--autoscale"
            assert int(rest[rest.index(size) + 1].split(",")[0]) >= 1
            assert {"--without-gossip", "--without-mingle", "--without-heartbeat"} <= set(rest)
    else:
        pytest.fail(f"unknown program {program!r} in {argv}")


def test_every_command_and_health_check_is_one_the_project_has(compose):
    for name, service in app_services(compose).items():
        check_command(service["command"], compose)
        if "healthcheck" in service:
            test = service["healthcheck"]["test"]
            argv = test[1:] if test[0] == "CMD" else shlex.split(test[1])
            check_command(argv, compose)
            if name.startswith("worker-"):
                worker_name = service["command"][service["command"].index("-n") + 1]
                assert worker_name.replace("%h", "$HOSTNAME") in test[1], name


def test_each_region_worker_consumes_its_own_regions_queue(compose):
    for region in regions(compose):
        command = compose["services"][f"worker-{region}"]["command"]
        assert command[command.index("-Q") + 1] == f"region.{region}"


def test_every_variable_given_to_the_app_is_one_the_project_reads(compose):
    read = project_environment_names()
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "REGIONS"} <= read
    for name, service in app_services(compose).items():
        unknown = set(service["environment"]) - read - IMAGE_VARIABLES
        assert not unknown, f"{name} sets variables nothing reads: {sorted(unknown)}"
        for needed in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY"):
            assert needed in service["environment"], (name, needed)


def test_the_urls_reach_the_services_with_their_passwords(compose):
    env = compose["services"]["web"]["environment"]
    database = dj_database_url.parse(env["DATABASE_URL"])
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert (database["HOST"], database["PASSWORD"]) == ("postgres", "pg-pw")
    assert compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pg-pw"
    kwargs = redis.Redis.from_url(env["REDIS_URL"]).connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["password"]) == ("redis", "redis-pw")
    assert compose["services"]["redis"]["command"][-2:] == ["--requirepass", "redis-pw"]
    kwargs = redis.Redis.from_url(env["DATAPLANE_REDIS_URL"]).connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["password"]) == ("dataplane", "redis-pw")
    assert compose["services"]["dataplane"]["command"][-2:] == ["--requirepass", "redis-pw"]


def test_the_data_plane_refuses_writes_past_the_memory_the_app_checks_runs_against(compose):
    command = compose["services"]["dataplane"]["command"]
    declared = compose["services"]["web"]["environment"]["REDIS_MAXMEMORY_MB"]

    assert command[command.index("--maxmemory") + 1] == f"{declared}mb"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_only_the_control_redis_writes_to_disk_and_each_has_its_own_memory(compose):
    control = compose["services"]["redis"]["command"]
    data = compose["services"]["dataplane"]["command"]

    assert control[control.index("--appendonly") + 1] == "yes"
    assert control[control.index("--appendfsync") + 1] == "always"
    assert data[data.index("--appendonly") + 1] == "no"
    assert data[data.index("--save") + 1] == ""
    assert control[control.index("--maxmemory-policy") + 1] == "noeviction"
    assert control[control.index("--maxmemory") + 1] != data[data.index("--maxmemory") + 1]


def test_the_settings_accept_the_app_environment_and_pass_the_deploy_checks(compose):
    env = {**compose["services"]["web"]["environment"], "PATH": os.environ["PATH"],
           "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "webapp.settings"}
    checked = subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                              "--fail-level", "WARNING"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_default_image_has_the_cpu_build_and_the_gpu_profile_a_cuda_build(compose):
    pin = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
               ["dependencies"] if d.startswith("torch"))
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f'pip install "{pin}" --index-url "$TORCH_INDEX_URL"' in dockerfile
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in dockerfile
    cpu = compose["services"]["web"]["build"]["args"]["TORCH_INDEX_URL"]
    gpu = compose["services"]["worker-gpu"]["build"]["args"]["TORCH_INDEX_URL"]
    assert cpu.endswith("/whl/cpu")
    assert re.search(r"/whl/cu\d+$", gpu)
