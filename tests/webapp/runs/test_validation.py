"""What a new run may read and start from, and whether it fits the hosts' memory
(webapp.runs.validation): each check names the problem in a sentence."""

from __future__ import annotations

import json
import os

import pytest

from diloco.config import RunConfig
from diloco.config_parse import ConfigError, parse_config
from tests.diloco.test_hf import TINY_LLAMA
from webapp.runs.models import Checkpoint, Run
from webapp.runs.validation import (
    admitted_configs,
    check_data_path,
    check_model_folder,
    check_tokenizer_folder,
    checkpoint_misfit,
    memory_misfits,
    size_report,
)

REGIONS = ["us-east", "us-west"]
# 2,148 MiB for island a (1,728 MiB of it activations at batch size 64), 447 MiB for
# island b, each with one warm standby of 269 MiB; about 87 MiB of Redis (64 MiB of it
# its base, which runs share), 576 MiB of syncd (512 MiB of it its base, shared too).
MODEL = {"n_layer": 4, "n_embd": 256, "n_head": 4, "block_size": 256}
ISLANDS = [{"name": "a", "region": "us-east", "batch_size": 64},
           {"name": "b", "region": "us-east", "batch_size": 1}]


@pytest.fixture
def sized(settings):
    """A run config of the model and islands above; the hosts' limits as set, with the
    published fragments on the data plane (SYNCD_SERVE off)."""
    settings.REGIONS = REGIONS
    settings.ISLAND_POOL_SIZE = 1
    settings.SYNCD_SERVE = "off"

    def limits(redis_mb: int, host_mb: int, syncd_mb: int = 10**6, islands=ISLANDS):
        settings.REDIS_MAXMEMORY_MB, settings.ISLAND_HOST_MEMORY_MB = redis_mb, host_mb
        settings.SYNCD_HOST_MEMORY_MB = syncd_mb
        return parse_config({"model": MODEL, "islands": islands}, REGIONS)

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
    misfits = memory_misfits(sized(redis_mb=80, host_mb=4000))

    assert list(misfits) == ["model"]
    assert misfits["model"][0].startswith("Redis would need about 87 MiB")
    assert "REDIS_MAXMEMORY_MB allows (80 MiB)" in misfits["model"][0]


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


def test_served_fragments_take_no_redis_so_a_run_too_large_for_it_with_them_fits(
        sized, settings):
    config = sized(redis_mb=80, host_mb=4000)
    assert list(memory_misfits(config)) == ["model"]

    settings.SYNCD_SERVE = "127.0.0.1:0"

    assert memory_misfits(config) == {}


def test_redis_is_summed_over_the_admitted_runs_its_base_once(sized):
    config = sized(redis_mb=120, host_mb=10**6)

    assert memory_misfits(config, [config]) == {}  # 87 + 23 MiB
    misfits = memory_misfits(config, [config, config])  # 87 + 45 MiB

    assert list(misfits) == ["model"]
    assert misfits["model"][0] == (
        "Redis would need about 87 MiB for this run (base 64 MiB, global fragments 13 MiB, "
        "update messages 6 MiB), and the 2 other admitted runs take 45 MiB already, "
        "more than REDIS_MAXMEMORY_MB allows (120 MiB): a smaller model, fewer "
        "sync.upload_slots or a lossy sync.compression would fit, or this run once others "
        "end.")


def test_syncd_is_summed_over_the_admitted_runs_its_base_once(sized):
    config = sized(redis_mb=10**6, host_mb=10**6, syncd_mb=620)

    assert memory_misfits(config) == {}  # 576 MiB
    misfits = memory_misfits(config, [config])  # 576 + 64 MiB

    assert list(misfits) == ["model"]
    assert misfits["model"][0].startswith("syncd would need about 576 MiB for this run "
                                          "(base 512 MiB, ")
    assert misfits["model"][0].endswith(
        "and the other admitted run takes 64 MiB already, more than SYNCD_HOST_MEMORY_MB "
        "allows (620 MiB): a smaller model or fewer islands would fit, or this run once "
        "others end.")


def test_a_regions_islands_of_every_admitted_run_share_its_island_host(sized):
    """Islands a (1,879 MiB without the standby) and b (178 MiB) in us-east with one
    standby (269 MiB) fit 2,500 MiB; beside another run's islands there they do not,
    and another run's islands elsewhere take nothing of it."""
    config = sized(redis_mb=10**6, host_mb=2500)
    west = sized(redis_mb=10**6, host_mb=2500,
                 islands=[{**island, "region": "us-west"} for island in ISLANDS])

    assert memory_misfits(config) == {}
    assert memory_misfits(config, [west]) == {}
    misfits = memory_misfits(config, [config])

    assert list(misfits) == ["islands.0.region"]
    assert misfits["islands.0.region"] == [
        "The island host of us-east would need about 1.8 GiB for this run's islands "
        "there ('a') and 269 MiB for its warm standbys, and the other admitted run takes "
        "2.0 GiB already in us-east, more than ISLAND_HOST_MEMORY_MB allows (2,500 MiB): "
        "another region, a smaller batch_size or model would fit, or this run once "
        "others end."]


def test_a_run_whose_islands_together_overfill_their_regions_host_names_the_first_over(
        sized):
    islands = [*ISLANDS, {"name": "c", "region": "us-east", "batch_size": 1}]
    config = sized(redis_mb=10**6, host_mb=2400, islands=islands)  # 1,879 + 2 x 178 + 269

    assert list(memory_misfits(config)) == ["islands.2.region"]
    assert "this run's islands there ('a', 'b', 'c')" in memory_misfits(
        config)["islands.2.region"][0]


@pytest.mark.django_db
def test_the_size_report_gives_the_estimate_the_limits_and_the_misfits(sized):
    config = sized(redis_mb=80, host_mb=4000, syncd_mb=3000)

    report = size_report({"model": MODEL, "islands": ISLANDS})

    assert report["limits"] == {"redis_bytes": 80 * 2**20, "syncd_host_bytes": 3000 * 2**20,
                                "island_host_bytes": 4000 * 2**20}
    assert report["taken"] == {"runs": 0, "redis_bytes": 0, "syncd_bytes": 0,
                               "island_host_bytes": {}}
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


@pytest.mark.django_db
def test_the_admitted_runs_are_those_queued_running_paused_or_stopping(sized):
    config = sized(redis_mb=10**6, host_mb=10**6).to_dict()
    runs = {state: Run.objects.create(name=state, mode="decoupled", config=config,
                                      state=state) for state in Run.State.values}

    admitted = admitted_configs(excluding=runs["running"])

    assert len(admitted) == 3  # queued, paused, stopping: not a draft, not a final run
    assert all(c.to_dict() == config for c in admitted)
    assert len(admitted_configs()) == 4


def test_a_users_model_folder_outside_the_data_roots_is_refused_before_it_is_read(
        data_root, operator, monkeypatch):
    from webapp.runs.lifecycle import create_run

    outside = data_root.parent / "model"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(TINY_LLAMA))
    read = []
    monkeypatch.setattr("diloco.hf.read_config", lambda text: read.append(text))
    config = {"model": {"source": "hf", "hf_config": str(outside)}}

    with pytest.raises(ConfigError) as e:
        create_run(name="escape", mode="decoupled", config=config, user=operator)

    assert list(e.value.errors) == ["model.hf_config"]
    assert e.value.errors["model.hf_config"][0].startswith("Must be a file or folder inside")
    assert read == [] and not Run.objects.exists()
    assert check_model_folder(config) != ""
    assert check_model_folder({"model": {"hf_config": json.dumps(TINY_LLAMA)}}) == ""


def test_a_users_tokenizer_folder_outside_the_data_roots_is_refused_before_it_is_read(
        data_root, operator, monkeypatch):
    from webapp.runs.lifecycle import create_run

    outside = data_root.parent / "tokenizer"
    outside.mkdir()
    (outside / "tokenizer.json").write_text("{}")
    read = []
    monkeypatch.setattr("diloco.tokenizer.read_json", lambda folder: read.append(folder))
    config = {"data": {"tokenizer": str(outside)}}

    with pytest.raises(ConfigError) as e:
        create_run(name="escape", mode="decoupled", config=config, user=operator)

    assert list(e.value.errors) == ["data.tokenizer"]
    assert e.value.errors["data.tokenizer"][0].startswith("Must be a file or folder inside")
    assert read == [] and not Run.objects.exists()
    assert check_tokenizer_folder({"data": {"tokenizer": "train"}}) == ""


def test_a_corpus_smaller_than_one_batch_is_refused_at_data_path(data_root, operator):
    from webapp.runs.lifecycle import create_run

    small = data_root / "small.jsonl"
    small.write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(40)))
    config = {"data": {"path": str(small), "tokenizer": "train", "vocab_size": 300},
              "model": {"block_size": 64},
              "islands": [{"name": n, "region": "us-east", "batch_size": 8} for n in "ab"]}

    with pytest.raises(ConfigError) as e:
        create_run(name="small", mode="decoupled", config=config, user=operator)

    assert list(e.value.errors) == ["data.path"]
    assert "fewer than one batch of 520" in e.value.errors["data.path"][0]
    assert not Run.objects.exists()
