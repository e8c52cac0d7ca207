import math

import pytest
import torch

from diloco.config_parse import parse_config
from diloco.island import initial_model
from syncd.evaluation import GlobalEval

TINY = {"model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "sync": {"inner_steps": 10}, "eval": {"interval_steps": 30, "tokens": 256}}


def config(tmp_path, **changes):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the islands train and the merge goes on.\n" * 400)
    return parse_config({**TINY, "data": {"path": str(corpus)}, **changes}, ["us-east"])


def test_an_evaluation_is_due_every_interval_of_global_inner_steps(tmp_path):
    evaluation = GlobalEval(config(tmp_path), min_gap_s=0.0)

    due = [outer for outer in range(12) if evaluation.due(outer, now=float(outer))]

    assert due == [3, 6, 9]  # 30 inner steps = 3 outer steps of H = 10


def test_evaluations_are_at_least_the_minimum_gap_apart_on_the_clock(tmp_path):
    evaluation = GlobalEval(config(tmp_path), min_gap_s=5.0)

    assert evaluation.due(3, now=100.0)
    assert not evaluation.due(6, now=102.0)
    assert evaluation.due(7, now=105.0)


def test_it_evaluates_the_given_parameters_on_held_out_text(tmp_path):
    run_config = config(tmp_path)
    evaluation = GlobalEval(run_config)
    params = dict(initial_model(run_config).state_dict())

    loss = evaluation(params)

    # An untrained byte model is close to uniform over 256 bytes.
    assert math.isfinite(loss) and abs(loss - math.log(256)) < 0.5


def test_a_background_evaluation_reads_the_globals_of_its_moment_and_is_picked_up_once(
        tmp_path):
    run_config = config(tmp_path)
    evaluation = GlobalEval(run_config)
    params = dict(initial_model(run_config).state_dict())
    expected = evaluation(params)

    assert evaluation.start(params)
    for name in params:
        params[name] = torch.zeros_like(params[name])  # merges replace the globals
    evaluation.wait(timeout=30)

    assert evaluation.result() == expected
    assert evaluation.result() is None


def test_an_evaluation_in_line_waits_for_the_one_in_the_background(tmp_path):
    run_config = config(tmp_path)
    evaluation = GlobalEval(run_config)
    params = dict(initial_model(run_config).state_dict())
    expected = evaluation(params)

    assert evaluation.start(params)
    at_the_end = evaluation(params)  # as the run's final evaluation does, at once
    evaluation.wait(timeout=30)

    assert at_the_end == expected
    assert evaluation.result() == expected


def test_the_next_evaluation_waits_until_the_last_ones_cpu_time_fits_its_share(tmp_path):
    run_config = config(tmp_path)
    evaluation = GlobalEval(run_config, min_gap_s=0.0, cpu_share=0.5, cores=2)
    params = dict(initial_model(run_config).state_dict())
    assert evaluation.due(3, now=100.0)
    assert evaluation.start(params)
    evaluation.wait(timeout=30)
    evaluation.result()

    # Half of two cores: c CPU seconds buy the next evaluation c seconds after the last.
    assert evaluation.cpu_s > 0
    assert evaluation.budget_until() == 100.0 + evaluation.cpu_s
    assert not evaluation.due(6, now=100.0 + evaluation.cpu_s / 2)
    assert evaluation.due(6, now=100.0 + evaluation.cpu_s)


def test_an_evaluation_cpu_share_outside_0_to_1_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cpu_share"):
        GlobalEval(config(tmp_path), cpu_share=0.0)


def test_its_bits_per_byte_divide_by_the_bytes_per_token_of_the_corpus_it_read(
        tmp_path, monkeypatch):
    from dataclasses import replace

    from diloco import data

    run_config = config(tmp_path)
    real = data.load_corpus
    monkeypatch.setattr(data, "load_corpus", lambda *a, **k: replace(
        real(*a, **k), meta={"bytes_per_token": {"validation": 4.0, "test": 9.0}}))
    evaluation = GlobalEval(run_config)

    loss = evaluation(dict(initial_model(run_config).state_dict()))

    assert evaluation.bits_per_byte(loss) == pytest.approx(loss / math.log(2) / 4.0)
