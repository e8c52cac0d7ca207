"""The overhead and merge benchmarks run end to end on tiny profiles.

Timings on a shared test machine mean nothing, so the bounds are zero here: the
tests check that each benchmark runs, writes the keys docs/BENCHMARKS.md reads,
and compares like with like.
"""

import json
import random

import pytest
import torch

from bench import merge, overhead, results
from diloco.data import load_corpus
from diloco.island import Island, initial_model

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
    out = json.loads((results_dir / "overhead.json").read_text())
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
    corpus = load_corpus(config.data.path, config.data.eval_fraction)
    init = initial_model(config).state_dict()
    island = Island(0, config, corpus, [], init)
    bare = overhead.BareLoop(config, corpus, init)
    for _ in range(3):
        x, y = island.sampler.batch(2)
        bx, by = bare.sampler.batch(2)
        assert torch.equal(x, bx) and torch.equal(y, by)
    assert all(torch.equal(p, q) for p, q in zip(island.model.parameters(),
                                                 bare.model.parameters(), strict=True))


def test_merge_writes_both_ratios_and_the_threads(results_dir, monkeypatch, one_thread):
    monkeypatch.setattr(merge, "COPY_BYTES", 1 << 20)
    monkeypatch.setitem(merge.PROFILES, "quick", {"model": TINY_MODEL, "updates": 3, "rounds": 2,
                                                  "bounds": {"ratio_to_memcpy": 0.0}})
    assert merge.main(quick=True) == 0
    out = json.loads((results_dir / "merge.json").read_text())
    assert out["ratio_to_memcpy"] > 0 and out["ingest_ratio_to_memcpy"] > 0
    assert out["threads"] == 1
    assert out["merged_bytes"] == 3 * 4 * out["model_params"]


def test_a_missed_target_exits_non_zero(results_dir, tiny_overhead, capsys):
    tiny_overhead["bounds"] = {"ratio": 1e9}
    assert overhead.main(quick=True) == 1
    assert "FAILED: island / bare tokens/s" in capsys.readouterr().err
