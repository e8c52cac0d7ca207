"""A checkpoint's model continuing a prompt (webapp.runs.sampling): the arguments it
refuses, a sample of a real checkpoint of a tiny model, repeatable by its seed, the
models it keeps (read once, the least recently used let go) and the samples it runs
at once."""

from pathlib import Path

import pytest

from diloco.island import initial_model
from syncd.checkpoint import save
from webapp.runs.models import Checkpoint, Run
from webapp.runs.sampling import MAX_SAMPLE_TOKENS, Sampler, SamplerBusy, sample

pytestmark = pytest.mark.django_db

TINY = {"model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "islands": [{"name": "a", "region": "us-east"}, {"name": "b", "region": "us-east"}]}


def save_checkpoint(folder, name: str = "tiny") -> Checkpoint:
    """A real checkpoint of a new tiny run's initial model."""
    run = Run.objects.create(name=name, mode="decoupled", config=TINY)
    params = initial_model(run.run_config()).state_dict()
    path = folder / f"{name}.safetensors"
    sha256, size = save(path, params, {}, [1], 1024)
    return Checkpoint.objects.create(run=run, versions={"0": 1}, outer_step=1,
                                     path=str(path), sha256=sha256, bytes=size)


@pytest.fixture
def checkpoint(tmp_path) -> Checkpoint:
    return save_checkpoint(tmp_path)


def test_a_prompt_over_its_limit_is_refused(viewer, redis_url, enqueued):
    from webapp.runs.sampling import MAX_PROMPT_CHARS, sample

    class NoCheckpoint:
        run = None

    with pytest.raises(ValueError, match=f"at most {MAX_PROMPT_CHARS} characters"):
        sample(NoCheckpoint(), "p" * (MAX_PROMPT_CHARS + 1))


@pytest.mark.parametrize("arguments, refusal", [
    ({"prompt": ""}, "prompt must be some text"),
    ({"prompt": "\ud800"}, "prompt must be text that UTF-8 can encode"),
    ({"tokens": 0}, f"tokens must be between 1 and {MAX_SAMPLE_TOKENS}"),
    ({"tokens": MAX_SAMPLE_TOKENS + 1}, "tokens must be between"),
    ({"temperature": 0.0}, "temperature must be above 0"),
])
def test_a_bad_argument_is_refused_with_what_it_must_be(checkpoint, arguments, refusal):
    with pytest.raises(ValueError, match=refusal):
        sample(checkpoint, **{"prompt": "islands", **arguments})


def test_a_checkpoint_of_a_deleted_run_cannot_be_sampled(checkpoint):
    checkpoint.run = None

    with pytest.raises(ValueError, match="run was deleted"):
        sample(checkpoint, "islands")


def test_a_checkpoint_whose_file_does_not_verify_is_refused(checkpoint):
    checkpoint.sha256 = "0" * 64

    with pytest.raises(ValueError, match="could not be loaded"):
        sample(checkpoint, "islands")


def test_a_sample_is_text_the_model_writes_and_its_seed_repeats_it(checkpoint):
    text = sample(checkpoint, "the islands ", tokens=12, seed=3)

    assert isinstance(text, str) and text
    assert sample(checkpoint, "the islands ", tokens=12, seed=3) == text


def test_a_prompt_longer_than_the_models_block_is_continued_from_its_end(checkpoint):
    assert sample(checkpoint, "p" * 100, tokens=4)


def test_two_samples_of_a_checkpoint_read_its_file_once(checkpoint):
    sampler = Sampler()
    first = sample(checkpoint, "the islands ", tokens=8, seed=1, sampler=sampler)
    Path(checkpoint.path).unlink()  # the cached model needs the file no more

    assert sample(checkpoint, "the islands ", tokens=8, seed=1, sampler=sampler) == first


def test_the_least_recently_sampled_model_is_let_go_beyond_the_cache(tmp_path):
    sampler = Sampler(cached=2)
    a, b, c = (save_checkpoint(tmp_path, name) for name in ("a", "b", "c"))
    for checkpoint in (a, b, a, c):  # b is the least recently used when c comes
        sample(checkpoint, "islands", tokens=1, sampler=sampler)
    for checkpoint in (a, b, c):
        Path(checkpoint.path).unlink()

    assert sample(a, "islands", tokens=1, sampler=sampler)
    assert sample(c, "islands", tokens=1, sampler=sampler)
    with pytest.raises(ValueError, match="could not be loaded"):
        sample(b, "islands", tokens=1, sampler=sampler)


def test_a_checkpoint_with_another_sha256_is_read_again(checkpoint):
    sampler = Sampler()
    sample(checkpoint, "islands", tokens=1, sampler=sampler)
    checkpoint.sha256 = "0" * 64

    with pytest.raises(ValueError, match="could not be loaded"):
        sample(checkpoint, "islands", tokens=1, sampler=sampler)


def test_a_sample_beyond_the_concurrent_bound_is_refused_not_queued(checkpoint):
    sampler = Sampler(concurrent=2)

    with (sampler.slot(), sampler.slot(),  # two samples under way
          pytest.raises(SamplerBusy, match="busy with 2 samples; ask again")):
        sample(checkpoint, "islands", tokens=1, sampler=sampler)

    assert sample(checkpoint, "islands", tokens=1, sampler=sampler)  # their slots are free


def test_a_sampler_needs_room_for_a_model_and_a_sample():
    with pytest.raises(ValueError, match="at least 1, got 0 and 2"):
        Sampler(cached=0)


def test_a_run_of_a_trained_tokenizer_samples_through_the_tokenizer_its_checkpoint_carries(
        tmp_path, text_path):
    from diloco.tokenizer import train_bpe

    tokenizer = train_bpe(iter(Path(text_path).read_text().splitlines()), 300)
    config = {**TINY, "data": {"path": text_path, "tokenizer": "train", "vocab_size": 300}}
    run = Run.objects.create(name="bpe", mode="decoupled", config=config)
    params = initial_model(run.run_config()).state_dict()
    path = tmp_path / "bpe.safetensors"
    sha256, size = save(path, params, {}, [1], 1024, tokenizer=tokenizer.json_text)
    checkpoint = Checkpoint.objects.create(run=run, versions={"0": 1}, outer_step=1,
                                           path=str(path), sha256=sha256, bytes=size)

    text = sample(checkpoint, "the islands", tokens=20, seed=1)

    assert params["tok_emb.weight"].shape[0] == 300
    assert len(text.encode()) > 20  # 20 tokens, some of them merges of several bytes
    assert text == sample(checkpoint, "the islands", tokens=20, seed=1)
