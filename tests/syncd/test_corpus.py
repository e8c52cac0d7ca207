"""syncd's corpus of a run, prepared in a thread of its own (syncd/corpus.py): the loop
that serves every run goes on ticking while a `train` tokenizer is trained."""

import json
import threading
from pathlib import Path

import pytest

from diloco import data, tokenizer
from diloco.config_parse import parse_config
from syncd import checkpoint
from syncd.corpus import RunCorpus
from tests.syncd.runs import CONFIG, heartbeat_all, make_run_sync
from webapp.runs.models import Checkpoint, Event, Run
from webapp.runs.reports import run_summary


def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i}: the islands train on. "
                                                f"ü{i % 13}"}) + "\n" for i in range(2000)))
    return path


@pytest.fixture
def held(monkeypatch):
    """Preparation that waits until `release` is set, having set `preparing`."""
    gate = {"preparing": threading.Event(), "release": threading.Event()}
    real = data.load_corpus

    def slow(*args, **kwargs):
        gate["preparing"].set()
        assert gate["release"].wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr("diloco.data.load_corpus", slow)
    return gate


def test_the_corpus_is_prepared_in_a_thread_and_read_once_ready(tmp_path, held):
    config = parse_config({"data": {"path": str(jsonl(tmp_path)), "tokenizer": "train",
                                    "vocab_size": 300}}, ["us-east"])
    corpus = RunCorpus(config.data, tmp_path / "data")
    assert not corpus.ready()

    corpus.start()
    assert held["preparing"].wait(10) and not corpus.ready()
    held["release"].set()

    assert corpus.get().meta["tokenizer"]["vocab_size"] == 300
    assert corpus.ready()


def failed_corpus(tmp_path) -> RunCorpus:
    """A corpus whose file is missing, read once: its preparation failed."""
    config = parse_config({"data": {"path": str(tmp_path / "missing.jsonl"),
                                    "tokenizer": "train"}}, ["us-east"])
    corpus = RunCorpus(config.data, tmp_path / "data")
    with pytest.raises(Exception, match=r"missing\.jsonl"):
        corpus.get()
    return corpus


def test_reading_a_corpus_that_failed_raises_its_error(tmp_path):
    corpus = failed_corpus(tmp_path)

    with pytest.raises(Exception, match=r"missing\.jsonl"):
        corpus.get()
    assert corpus.ready()


@pytest.mark.integration
@pytest.mark.django_db
def test_syncd_ticks_on_while_a_train_tokenizers_corpus_is_prepared_and_checkpoints_after(
        redis_url, tmp_path, monkeypatch, held):
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    config = {**CONFIG, "data": {"path": str(jsonl(tmp_path)), "tokenizer": "train",
                                 "vocab_size": 300}}
    sync = make_run_sync(redis_url, tmp_path, "decoupled", config)
    heartbeat_all(sync)
    assert held["preparing"].wait(10)  # syncd began preparing it when it took the run
    sync.recovery.ask_for_checkpoint()

    sync.tick()  # returns: the checkpoint waits for the corpus, the loop does not

    run = sync.recorder.run_id
    assert not Checkpoint.objects.filter(run_id=run).exists()
    held["release"].set()
    sync.recovery.corpus.get()
    sync.tick()
    saved = Checkpoint.objects.get(run_id=run)
    tokenizer = checkpoint.load_tokenizer(Path(saved.path), saved.sha256)
    assert tokenizer == sync.recovery.corpus.get().tokenizer_json()


def test_the_records_a_preparation_skipped_are_reported_once_with_their_lines(tmp_path):
    path = jsonl(tmp_path)
    lines = path.read_text().splitlines()
    lines[5], lines[9] = "{bad", json.dumps({"body": "x"})
    path.write_text("\n".join(lines) + "\n")
    config = parse_config({"data": {"path": str(path), "tokenizer": "train",
                                    "vocab_size": 300}}, ["us-east"])
    corpus = RunCorpus(config.data, tmp_path / "data")
    assert corpus.report() is None  # not prepared yet
    corpus.get()

    report = corpus.report()

    assert "skipped 1 not JSON, 1 without text in 'text'" in report["message"]
    assert "c.jsonl:6: not JSON" in report["message"]
    assert "c.jsonl:10: no text in field 'text'" in report["message"]
    assert report["skipped_records"]["bad_json"] == 1
    assert corpus.report() is None  # once


def test_a_corpus_that_skipped_nothing_reports_nothing(tmp_path):
    config = parse_config({"data": {"path": str(jsonl(tmp_path)), "tokenizer": "train",
                                    "vocab_size": 300}}, ["us-east"])
    corpus = RunCorpus(config.data, tmp_path / "data")
    corpus.get()

    assert corpus.report() is None


@pytest.mark.integration
@pytest.mark.django_db
def test_syncd_records_the_skipped_lines_as_an_alert_event_of_the_run(
        redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    path = jsonl(tmp_path)
    path.write_text(path.read_text() + "{bad\n")
    config = {**CONFIG, "data": {"path": str(path), "tokenizer": "train", "vocab_size": 300}}
    sync = make_run_sync(redis_url, tmp_path, "decoupled", config)
    heartbeat_all(sync)
    sync.corpus.get()

    sync.tick()
    sync.recorder.flush()

    alert = Event.objects.get(run_id=sync.recorder.run_id, kind="alert")
    assert "c.jsonl:2001: not JSON" in alert.detail["message"]
    assert alert.detail["skipped_records"]["bad_json"] == 1


@pytest.fixture
def trained_after_its_pass(monkeypatch):
    """A `train` tokenizer's training that, its pass over the corpus read, waits until
    `release` is set, having set `preparing`."""
    gate = {"preparing": threading.Event(), "release": threading.Event()}
    real = tokenizer.train_bpe

    def paused(texts, vocab_size):
        read = list(texts)
        gate["preparing"].set()
        assert gate["release"].wait(60)
        return real(iter(read), vocab_size)

    monkeypatch.setattr("diloco.tokenizer.train_bpe", paused)
    return gate


def test_a_corpus_not_begun_reads_waiting_with_no_counts(tmp_path):
    config = parse_config({"data": {"path": str(jsonl(tmp_path))}}, ["us-east"])

    status = RunCorpus(config.data, tmp_path / "data").status()

    assert status == {"state": "waiting", "stage": "", "bytes_read": 0, "bytes_total": 0,
                      "documents": 0, "skipped": 0, "error": None}


def test_a_failed_corpus_reads_failed_with_its_error(tmp_path):
    corpus = failed_corpus(tmp_path)

    assert corpus.status()["state"] == "failed"
    assert "missing.jsonl" in corpus.status()["error"]


@pytest.mark.integration
@pytest.mark.django_db
def test_the_status_and_the_api_show_the_corpus_preparation_while_it_is_under_way(
        redis_url, tmp_path, monkeypatch, trained_after_its_pass):
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    path = jsonl(tmp_path)
    path.write_text(path.read_text() + "{bad\n")
    config = {**CONFIG, "data": {"path": str(path), "tokenizer": "train", "vocab_size": 300}}
    sync = make_run_sync(redis_url, tmp_path, "decoupled", config)
    heartbeat_all(sync)
    assert trained_after_its_pass["preparing"].wait(30)

    sync.tick()

    corpus = sync.store.status()["corpus"]
    size = path.stat().st_size
    assert corpus == {"state": "preparing", "stage": "training the tokenizer",
                      "bytes_read": size, "bytes_total": size, "documents": 2000,
                      "skipped": 1, "error": None}
    assert run_summary(Run.objects.get(pk=sync.recorder.run_id))["corpus"] == corpus
    trained_after_its_pass["release"].set()
    sync.corpus.get()
    sync.clock_state["now"] += 60
    sync.tick()
    ready = sync.store.status()["corpus"]
    assert (ready["state"], ready["stage"], ready["documents"]) == ("ready", "tokenizing", 2000)
