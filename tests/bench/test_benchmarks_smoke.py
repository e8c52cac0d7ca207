"""The overhead and merge benchmarks run end to end on tiny profiles.

Timings on a shared test machine mean nothing, so the bounds are zero here: the
tests check that each benchmark runs, writes the keys docs/BENCHMARKS.md reads,
and compares like with like.
"""

import json
import math
import random
from dataclasses import replace

import pytest
import torch

from bench import merge, overhead, results, signing
from diloco.data import load_corpus
from diloco.island import Island, initial_model
from syncd.environment import data_dir

TINY_MODEL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}


@pytest.fixture
def results_dir(monkeypatch, tmp_path):
    """Results go to a temporary folder, not bench/results."""
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    return tmp_path / "results"


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_overhead(monkeypatch, tmp_path):
    rng = random.Random(0)
    words = ("island", "fragment", "merge", "outer", "inner", "token", "anchor")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(8))
                                for _ in range(2000)))
    profile = {"model": TINY_MODEL, "batch_size": 2, "inner_steps": 4, "fragments": 2,
               "codec": "int4", "rounds": 2, "data_path": str(corpus), "bounds": {"ratio": 0.0}}
    monkeypatch.setitem(overhead.PROFILES, "quick", profile)
    return profile


def test_overhead_writes_both_ratios(results_dir, tiny_overhead):
    assert overhead.main(quick=True) == 0
    out = json.loads((results_dir / "overhead-quick.json").read_text())
    assert out["ratio"] > 0 and out["ratio_with_sync"] > 0
    assert out["island_tokens_per_s"] > out["island_with_sync_tokens_per_s"]
    assert out["steps"] == 2 * 4 and out["rounds"] == 2
    assert out["checks"]["island / bare tokens/s"]["ok"]


def test_overhead_restores_the_thread_count(results_dir, tiny_overhead):
    threads = torch.get_num_threads()
    overhead.main(quick=True)
    assert torch.get_num_threads() == threads


def test_the_bare_loop_trains_on_the_islands_batches(tiny_overhead):
    config = overhead.make_config(tiny_overhead)
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    init = initial_model(config).state_dict()
    island = Island(0, config, corpus, [], init)
    bare = overhead.BareLoop(config, corpus, init)
    for _ in range(3):
        x, y = island.sampler.batch(2)
        bx, by = bare.sampler.batch(2)
        assert torch.equal(x, bx) and torch.equal(y, by)
    assert all(torch.equal(p, q) for p, q in zip(island.model.parameters(),
                                                 bare.model.parameters(), strict=True))


def test_merge_writes_its_ratios_and_the_threads(results_dir, monkeypatch, one_thread,
                                                 tmp_path):
    monkeypatch.setattr(merge, "COPY_BYTES", 1 << 20)
    monkeypatch.setattr(merge, "FILES", tmp_path / "published")
    monkeypatch.setitem(merge.PROFILES, "quick", {"model": TINY_MODEL, "updates": 3, "rounds": 2,
                                                  "bounds": {"ratio_to_memcpy": 0.0}})
    assert merge.main(quick=True) == 0
    out = json.loads((results_dir / "merge-quick.json").read_text())
    assert out["ratio_to_memcpy"] > 0 and out["ingest_ratio_to_memcpy"] > 0
    assert out["file_ratio_to_memcpy"] > 0
    # The fragment's full message and its momentum, both float32.
    assert out["file_bytes"] > 2 * 4 * out["model_params"]
    assert not (tmp_path / "published").exists()  # the files go at the end
    assert out["threads"] == 1
    assert out["merged_bytes"] == 3 * 4 * out["model_params"]


def test_signing_writes_both_protocols_hashes_for_every_size(results_dir, monkeypatch):
    monkeypatch.setitem(signing.PROFILES, "quick", {"sizes_mb": (1,), "repeats": {1: 2}})

    assert signing.main(quick=True) == 0

    (row,) = json.loads((results_dir / "signing-quick.json").read_text())["rows"]
    assert row["size_mb"] == 1
    assert all(row[k] > 0 for k in signing.WAYS)


def test_a_missed_target_exits_non_zero(results_dir, tiny_overhead, capsys):
    tiny_overhead["bounds"] = {"ratio": 1e9}
    assert overhead.main(quick=True) == 1
    assert "FAILED: island / bare tokens/s" in capsys.readouterr().err


def test_quality_chooses_data_parallels_rate_on_validation_and_reports_the_test_split(
        results_dir, monkeypatch, text_path):
    from bench import quality
    from diloco.evaluation import Evaluator

    splits = []
    monkeypatch.setattr(Evaluator, "__init__", spy_on_split(Evaluator.__init__, splits))
    monkeypatch.setitem(quality.PROFILES, "quick", {
        "model": TINY_MODEL, "data_path": text_path, "tokens": 20 * 512, "inner_steps": 4,
        "warmup": 2, "eval_tokens": 256, "seeds": [0], "sweep": [4], "dp_lrs": [1e-3, 4e-3],
        "dp_max_runs": 2,
        "bounds": {"decoupled_vs_sync": 9.0, "sync_vs_dp": 9.0, "int4_vs_decoupled": 9.0,
                   "bytes_ratio": 0.0, "peak_ratio": 9.0}})

    quality.main(quick=True)

    out = json.loads((results_dir / "quality-quick.json").read_text())
    sweep = out["dp_lr_sweep"]
    assert sweep["chosen"] == min(sweep["rows"], key=lambda r: r["validation_loss"])["inner_lr"]
    assert all(set(row) == {"inner_lr", "validation_loss"} for row in sweep["rows"])
    chosen = next(r for r in sweep["rows"] if r["inner_lr"] == sweep["chosen"])
    assert out["dp"]["validation_loss"] == chosen["validation_loss"]  # the same run
    # Every run watched validation; each reported figure is one test evaluation more.
    assert out["splits"] == {"reported": "test", "tuning": "validation"}
    assert splits.count("test") == 4  # dp, diloco_sync, decoupled, decoupled_int4
    for name in quality.MAIN:
        assert out[name]["eval_loss"] != out[name]["validation_loss"]


def spy_on_split(init, splits: list[str]):
    def spy(self, config, corpus, split, device="cpu"):
        splits.append(split)
        init(self, config, corpus, split, device)
    return spy


def test_a_presets_config_keeps_its_own_codecs_or_takes_float32_both_ways():
    from bench import quality

    own = quality.preset_run_config("gpt2_small", 3, 5000, lossless=False)
    lossless = quality.preset_run_config("gpt2_small", 3, 5000, lossless=True)

    assert (own.sync.compression, own.sync.downlink_compression) == ("int4", "int8")
    assert (lossless.sync.compression, lossless.sync.downlink_compression) == ("none", "none")
    for config in (own, lossless):
        assert (config.seed, config.budget.total_tokens, config.model.n_layer) == (3, 5000, 12)
        assert [i.name for i in config.islands] == ["us-east-a", "us-west-a"]
    assert replace(own, sync=lossless.sync) == lossless  # nothing else differs


def test_the_preset_check_trains_both_codecs_from_each_seed_and_compares_on_test(
        results_dir, monkeypatch, text_path):
    from bench import quality
    from diloco.evaluation import Evaluator

    splits = []
    monkeypatch.setattr(Evaluator, "__init__", spy_on_split(Evaluator.__init__, splits))
    tiny = {**quality.PRESETS["paper"][1], "model": TINY_MODEL, "data": {"path": text_path},
            "eval": {"tokens": 256}, "train": {"device": "cpu"}}
    monkeypatch.setitem(quality.PRESETS, "paper", ("tiny paper", tiny))
    monkeypatch.setitem(quality.PRESET_PROFILES, "quick",
                        {"tokens": 20 * 512, "seeds": [0, 1], "eval_points": 2})

    code = quality.main(quick=True, preset="paper")

    out = json.loads((results_dir / "quality-preset-paper.json").read_text())
    assert [(r["seed"], r["codecs"]) for r in out["runs"]] == [
        (0, "none"), (0, "int4 up, int8 down"), (1, "none"), (1, "int4 up, int8 down")]
    assert all(r["tokens"] >= 20 * 512 for r in out["runs"])
    lossy = [r["bytes_per_token"] for r in out["runs"] if r["codecs"] != "none"]
    assert max(lossy) < min(r["bytes_per_token"] for r in out["runs"] if r["codecs"] == "none")
    assert splits.count("test") == 4  # each run's reported figure
    (check,) = out["checks"].values()
    mean = [sum(r["eval_loss"] for r in out["runs"] if (r["codecs"] == "none") == lossless) / 2
            for lossless in (False, True)]
    assert check["value"] == round(mean[0] / mean[1], 4)
    assert code == (0 if check["ok"] else 1)
    assert (out["device"], out["device_name"]) == ("cpu", "cpu")


def test_the_data_parallel_sweep_goes_past_an_end_while_that_end_is_best(monkeypatch):
    # A validation loss whose minimum is at 8e-3: past the sweep's 4e-3, found by doubling.
    from bench import quality
    from diloco.cluster import LocalResult

    def run_one(label, config, mode, window_steps):
        loss = 2.0 + math.log2(config.optim.inner_lr / 8e-3) ** 2
        return LocalResult(mode, loss, 0, 0.0, 0, 0, 0, 0.0, 0, 0, 0, 0)

    monkeypatch.setattr(quality, "run_one", run_one)
    profile = {**quality.PROFILES["quick"], "dp_lrs": [1e-3, 2e-3, 4e-3], "dp_max_runs": 6}

    rows, runs = quality.dp_lr_sweep(profile, window=12)

    assert [r["inner_lr"] for r in rows] == pytest.approx([1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2])
    assert quality.chosen_lr(rows) == pytest.approx(8e-3)
    assert set(runs) == {r["inner_lr"] for r in rows}


def test_the_data_parallel_sweep_stops_at_its_most_runs(monkeypatch):
    from bench import quality
    from diloco.cluster import LocalResult

    def run_one(label, config, mode, window_steps):  # the larger, the better: no end
        return LocalResult(mode, 1.0 / config.optim.inner_lr, 0, 0.0, 0, 0, 0, 0.0, 0, 0, 0, 0)

    monkeypatch.setattr(quality, "run_one", run_one)
    profile = {**quality.PROFILES["quick"], "dp_lrs": [1e-3, 2e-3, 4e-3], "dp_max_runs": 4}

    rows, _ = quality.dp_lr_sweep(profile, window=12)

    assert [r["inner_lr"] for r in rows] == pytest.approx([1e-3, 2e-3, 4e-3, 8e-3])


def test_the_bare_loop_clips_the_gradient_as_an_island_when_asked(tiny_overhead):
    config = overhead.make_config(tiny_overhead)
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    init = initial_model(config).state_dict()
    for clip in (False, True):
        bare = overhead.BareLoop(config, corpus, init, clip=clip)
        bare.step()  # the first step's gradient of a fresh model is well above norm 1
        norm = torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(p.grad) for p in bare.model.parameters()]))
        assert (norm <= 1.0 + 1e-4) == clip
