"""The models benchmark (bench/models.py): its run of the preset, the export's held-out
loss by transformers against the evaluator's on a tiny Llama, its arithmetic and its
report on figures made up here. Its quick profile on the real system takes minutes
(two bare phases and a 20M-parameter Llama on CPU), so no test here runs it: the
committed bench/results/models-quick.json is checked for what the report writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import models, results
from diloco.config_parse import parse_config
from diloco.data import load_corpus
from diloco.evaluation import Evaluator
from diloco.hf import export
from diloco.island import initial_model
from diloco.presets import LLAMA_20M
from diloco.sizes import estimate

COMMITTED = Path(__file__).resolve().parents[2] / "bench" / "results" / "models-quick.json"
TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
              "max_position_embeddings": 32}


def test_the_benchmark_trains_the_presets_llama_at_the_profiles_batch_and_h():
    config = models.run_config(models.PROFILES["quick"], "/corpus.txt")
    parsed = parse_config(config, list(models.efficiency.REGIONS))

    assert json.loads(parsed.model.hf_config) == LLAMA_20M
    assert parsed.model.source == "hf" and parsed.data.path == "/corpus.txt"
    assert parsed.sync.inner_steps == models.PROFILES["quick"]["inner_steps"]
    assert [i.batch_size for i in parsed.islands] == [2, 2]


def test_the_exports_loss_by_transformers_is_the_evaluators_on_the_same_windows(
        tmp_path, monkeypatch):
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"island {i % 7} merges fragment {i % 3}.\n" for i in range(600)))
    config = parse_config({"model": {"source": "hf", "hf_config": json.dumps(TINY_LLAMA),
                                     "block_size": 16},
                           "eval": {"tokens": 1024}, "data": {"path": str(text)}},
                          ["us-east"])
    corpus = load_corpus(str(text), config.data.eval_fraction, tmp_path / "data")
    model = initial_model(config)
    with torch.no_grad():  # weights a run could have trained, not the initial draw
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export(model.config, model.state_dict(), tmp_path / "export", "readme")

    theirs = models.held_out_loss(tmp_path / "export", Path(corpus.folder), 1024, 16)

    ours = Evaluator(config, corpus, "validation")(model.state_dict())
    assert theirs == pytest.approx(ours, abs=1e-5)


def test_the_estimates_error_is_relative_to_what_was_measured():
    assert models.estimate_error(115, 100) == pytest.approx(0.15)
    assert models.estimate_error(80, 100) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="above 0"):
        models.estimate_error(100, 0)


def test_the_memory_is_held_to_the_expected_bytes_and_under_the_peak():
    config = models.run_config(models.PROFILES["quick"], "/corpus.txt")
    sized = estimate(parse_config(config, list(models.efficiency.REGIONS)))
    expected = sized.expected["us-east-a"].total
    measured = {"us-east-a": {"peak_bytes": 0, "idle_bytes": 0,
                              "above_idle_bytes": expected * 10 // 11},
                "us-west-a": {"peak_bytes": 0, "idle_bytes": 0,
                              "above_idle_bytes": expected}}

    memory = models.memory_figures(config, measured)

    assert memory["estimate_error"] == pytest.approx(0.1, abs=1e-4)
    assert memory["islands"]["us-west-a"]["error"] == 0
    assert memory["of_peak"] == pytest.approx(expected / sized.islands["us-west-a"].total,
                                              abs=1e-4)
    assert memory["expected_parts"] == sized.expected["us-east-a"].parts
    assert memory["peak_parts"] == sized.islands["us-east-a"].parts


def figures(ratio: float, difference: float, error: float, of_peak: float = 0.7) -> dict:
    throughput = {"ratio": ratio, "merged_tokens_per_s": 300.0 * ratio,
                  "bare_tokens_per_s": 300.0, "ratio_per_cpu": 0.97,
                  "island_cpu_step_ratio": 0.98, "island_cpu_ms_per_step": 900.0,
                  "bare_cpu_ms_per_step": 880.0, "phases": {"system": [], "bare": []}}
    export = {"eval_loss": 2.5, "eval_bpb": 3.6, "transformers_loss": 2.5 + difference,
              "export_loss_difference": difference}
    memory = {"params": 19_536_384, "estimate_error": error, "of_peak": of_peak,
              "islands": {}, "expected_parts": {"parameters": 78_145_536},
              "peak_parts": {"parameters": 78_145_536}}
    return models.summarize(throughput, export, memory)


def test_the_report_writes_the_four_checks_and_says_a_miss(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(results, "RESULTS", tmp_path)

    code = models.report(models.PROFILES["quick"], True, figures(0.95, 2e-6, 0.3), 1.0,
                         [1.0, 1.0, 1.0])

    data = json.loads((tmp_path / "models-quick.json").read_text())
    assert code == 1
    assert data["checks"]["throughput_vs_bare"]["ok"]
    assert data["checks"]["export_loss_equal"]["ok"]
    assert not data["checks"]["estimate_memory"]["ok"]
    assert data["checks"]["memory_within_peak"] == {"value": 0.7, "bound": "<= 1.0",
                                                    "ok": True}
    assert data["throughput_vs_bare"] == 0.95 and data["throughput"]["ratio_per_cpu"] == 0.97
    assert "phases" not in data["throughput"]  # the samples file holds them
    assert "FAILED: estimate_memory" in capsys.readouterr().err
def test_the_committed_quick_results_hold_the_figures_and_checks_the_report_writes():
    data = json.loads(COMMITTED.read_text())

    assert data["profile"] == "quick" and data["preset"] == models.PRESET
    assert set(data["checks"]) == {"throughput_vs_bare", "export_loss_equal",
                                   "estimate_memory", "memory_within_peak"}
    for check in data["checks"].values():
        assert set(check) == {"value", "bound", "ok"} and isinstance(check["ok"], bool)
    assert data["params"] > 10**7 and data["eval_bpb"] > 0
    assert data["throughput"]["ratio"] == data["throughput_vs_bare"]
    assert {"ratio_per_cpu", "island_cpu_step_ratio", "cpu_share"} <= set(data["throughput"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(data["export_files"])
    assert data["seconds"] > 0 and data["load_before"]
