"""A checkpoint's model continuing a prompt (webapp.runs.sampling): the arguments it
refuses, and a sample of a real checkpoint of a tiny model, repeatable by its seed."""

import pytest

from diloco.island import initial_model
from syncd.checkpoint import save
from webapp.runs.models import Checkpoint, Run
from webapp.runs.sampling import MAX_SAMPLE_TOKENS, sample

pytestmark = pytest.mark.django_db

TINY = {"model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "islands": [{"name": "a", "region": "us-east"}, {"name": "b", "region": "us-east"}]}


@pytest.fixture
def checkpoint(tmp_path) -> Checkpoint:
    """A real checkpoint of a tiny run's initial model."""
    run = Run.objects.create(name="tiny", mode="decoupled", config=TINY)
    params = initial_model(run.run_config()).state_dict()
    path = tmp_path / "checkpoint.safetensors"
    sha256, size = save(path, params, {}, [1], 1024)
    return Checkpoint.objects.create(run=run, versions={"0": 1}, outer_step=1,
                                     path=str(path), sha256=sha256, bytes=size)


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
