"""The many-hosts system's configuration (bench/hosts.py) against what compose.yaml
gives its services and what docs/OPERATIONS.md tells an operator of regions on hosts
of their own: the three say the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.hosts import HOST_TRUST, SERVICE_ENVIRONMENT, SHARED_ENVIRONMENT, Hosts
from bench.netns import Network
from tests.test_compose import load_compose, regions

ROOT = Path(__file__).resolve().parents[2]


def operations_section(title: str) -> str:
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_compose_gives_each_service_every_variable_the_harness_configures_it_with():
    compose = load_compose()
    services = {"syncd": ["syncd"], "web": ["web"], "migrate": ["migrate"],
                "worker": [f"worker-{r}" for r in regions(compose)],
                "pool": [f"pool-{r}" for r in regions(compose)]}
    for kind, names in services.items():
        for name in names:
            given = set(compose["services"][name]["environment"])
            missing = (set(SHARED_ENVIRONMENT) | set(SERVICE_ENVIRONMENT[kind])) - given
            assert not missing, f"compose.yaml's {name} lacks {sorted(missing)}"


def test_the_operations_guide_names_every_variable_and_bind_of_the_harness():
    section = operations_section("Regions on separate hosts")
    named = set(re.findall(r"`([A-Z][A-Z0-9_]+)(?:=[^`]*)?`", section))
    every = {*SHARED_ENVIRONMENT, *HOST_TRUST, *(v for kind in SERVICE_ENVIRONMENT.values()
                                                 for v in kind)}
    assert every <= named, sorted(every - named)
    assert "--bind ADDRESS --requirepass" in section and "daphne -b ADDRESS" in section


def test_a_process_is_configured_only_by_the_variables_of_its_kind():
    hosts = Hosts(Network(["us-east"], 40.0))
    with pytest.raises(ValueError, match="a worker is not configured by"):
        hosts.env("worker", "worker", SYNCD_SERVE="10.249.0.1:8765")
    env = hosts.env("pool", "pool", ISLAND_POOL_SIZE="1", SSL_CERT_FILE="/ca.pem")
    assert set(SHARED_ENVIRONMENT) <= set(env) and env["ISLAND_POOL_SIZE"] == "1"
