"""What a new run may read and start from, and whether it fits the hosts' memory
(webapp.runs.validation): each check names the problem in a sentence."""

from __future__ import annotations

import os

import pytest

from diloco.config import RunConfig
from diloco.config_parse import ConfigError, parse_config
from webapp.runs.models import Checkpoint, Run
from webapp.runs.validation import (
    check_data_path,
    checkpoint_misfit,
    memory_misfits,
    size_report,
)

REGIONS = ["us-east", "us-west"]
# 2,122 MiB for island a (1,728 MiB of it activations at batch size 64), 421 MiB for
# island b, about 122 MiB of Redis.
MODEL = {"n_layer": 4, "n_embd": 256, "n_head": 4, "block_size": 256}
ISLANDS = [{"name": "a", "region": "us-east", "batch_size": 64},
           {"name": "b", "region": "us-east", "batch_size": 1}]


@pytest.fixture
def sized(settings):
    """A run config of the model and islands above; the hosts' limits as set."""
    settings.REGIONS = REGIONS
    settings.ISLAND_POOL_SIZE = 1

    def limits(redis_mb: int, host_mb: int):
        settings.REDIS_MAXMEMORY_MB, settings.ISLAND_HOST_MEMORY_MB = redis_mb, host_mb
        return parse_config({"model": MODEL, "islands": ISLANDS}, REGIONS)

    return limits


def test_a_data_path_inside_a_data_root_is_accepted(data_root):
    assert check_data_path(str(data_root / "corpus" / "text.txt")) == ""
    assert check_data_path(str(data_root / "corpus")) == ""
    assert check_data_path("") == ""  # the default corpus


@pytest.mark.parametrize("escape", ["{root}/../secret.txt", "{root}/corpus/../../secret.txt",
                                    "/etc/passwd", "secret.txt", "~/.ssh/id_rsa"])
def test_a_data_path_outside_every_data_root_is_refused_naming_the_roots(escape, data_root):
    message = check_data_path(escape.format(root=data_root))

    assert message.startswith(f"Must be a file or folder inside one of the data folders "
                              f"({data_root.resolve()}; setting DATA_ROOTS)")


def test_a_symlink_out_of_a_data_root_is_refused(data_root):
    link = data_root / "corpus" / "innocent.txt"
    os.symlink(data_root.parent / "secret.txt", link)
    folder_link = data_root / "etc"
    os.symlink("/etc", folder_link)

    assert check_data_path(str(link)).startswith("Must be a file or folder inside")
    assert check_data_path(str(folder_link / "passwd")).startswith("Must be a file or folder")


def test_a_run_that_fits_the_hosts_memory_has_no_misfits(sized):
    assert memory_misfits(sized(redis_mb=1000, host_mb=4000)) == {}


def test_a_run_too_large_for_redis_is_a_misfit_of_the_model_naming_the_setting(sized):
    misfits = memory_misfits(sized(redis_mb=100, host_mb=4000))

    assert list(misfits) == ["model"]
    assert misfits["model"][0].startswith("Redis would need about 122 MiB")
    assert "REDIS_MAXMEMORY_MB allows (100 MiB)" in misfits["model"][0]


def test_an_island_that_fits_but_for_its_activations_is_a_misfit_of_its_batch_size(sized):
    misfits = memory_misfits(sized(redis_mb=1000, host_mb=1000))

    assert list(misfits) == ["islands.0.batch_size"]
    assert misfits["islands.0.batch_size"][0].startswith(
        "Island 'a' would need about 2.1 GiB, 1.7 GiB of it activations")
    assert "a smaller batch_size would fit" in misfits["islands.0.batch_size"][0]


def test_islands_too_large_even_without_activations_are_one_misfit_of_the_model(sized):
    misfits = memory_misfits(sized(redis_mb=1000, host_mb=300))

    assert list(misfits) == ["model"] and len(misfits["model"]) == 1
    assert misfits["model"][0].startswith("Island 'a' would need about 2.1 GiB")
    assert "ISLAND_HOST_MEMORY_MB allows (300 MiB): a smaller model" in misfits["model"][0]


def test_the_size_report_gives_the_estimate_the_limits_and_the_misfits(sized):
    config = sized(redis_mb=100, host_mb=4000)

    report = size_report({"model": MODEL, "islands": ISLANDS})

    assert report["limits"] == {"redis_bytes": 100 * 2**20, "island_host_bytes": 4000 * 2**20}
    assert list(report["misfits"]) == ["model"]
    assert report["misfits"] == memory_misfits(config)


def test_the_size_report_of_an_invalid_config_raises_its_errors(sized):
    sized(redis_mb=100, host_mb=4000)

    with pytest.raises(ConfigError):
        size_report({"model": {"n_layer": 0}})


@pytest.mark.django_db
def test_a_checkpoint_fits_a_run_of_its_runs_model_and_not_of_another(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    path.write_bytes(b"weights")
    model = {**RunConfig().to_dict()["model"], **MODEL}  # as a run's config keeps it
    source = Run.objects.create(name="source", mode="decoupled", config={"model": model})
    checkpoint = Checkpoint.objects.create(run=source, outer_step=3, path=str(path),
                                           sha256="0" * 64, bytes=7)

    assert checkpoint_misfit(checkpoint, {"model": MODEL}) == ""
    assert checkpoint_misfit(checkpoint, {"model": {**MODEL, "n_layer": 2}}).startswith(
        "The run's model settings must be those of the checkpoint's run")


@pytest.mark.django_db
def test_a_checkpoint_whose_file_is_gone_or_whose_run_is_gone(tmp_path):
    kept = tmp_path / "kept.safetensors"
    kept.write_bytes(b"weights")
    orphan = Checkpoint.objects.create(run=None, outer_step=1, path=str(kept),
                                       sha256="0" * 64, bytes=7)
    gone = Checkpoint.objects.create(run=None, outer_step=1, path=str(tmp_path / "gone"),
                                     sha256="0" * 64, bytes=7)

    # Its run's model settings went with the run: no run can start from it.
    assert "run was deleted" in checkpoint_misfit(orphan, {"model": {"n_layer": 9}})
    assert checkpoint_misfit(gone, {}) == f"The checkpoint's file {tmp_path / 'gone'} is gone."
