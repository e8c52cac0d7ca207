"""A small text corpus and tiny run configs for the trainer's tests.

The default corpus (the standard library's sources, about 30 MiB) is prepared
once per data directory; the tests that do not test it train on a few hundred
kilobytes of generated text.
"""

import random

import pytest
import torch

from trainer.config import RunConfig, parse_config

REGIONS = ["us-east", "eu-west"]
# The models here are tiny: a second thread only adds synchronization, and on a
# busy two-core machine OpenMP threads that spin-wait for each other make every
# step hundreds of times slower.
torch.set_num_threads(1)

WORDS = ("island", "fragment", "quorum", "grace", "merge", "outer", "inner", "step", "token",
         "weight", "anchor", "global", "version", "delta", "sync", "region", "link",
         "bandwidth", "latency", "model", "data")


@pytest.fixture(scope="session")
def text_path(tmp_path_factory) -> str:
    """One text file of about 200 KB; the same path all session, so it is prepared once."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "."
             for _ in range(4000)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines))
    return str(path)


@pytest.fixture
def make_config(text_path):
    """Build a tiny, valid RunConfig; sections given as dicts override the defaults."""

    def make(islands: int = 2, batch_size: int = 4, **sections) -> RunConfig:
        data = {
            "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
            "data": {"path": text_path},
            "eval": {"tokens": 256},
            "budget": {"total_tokens": 1024},
            "islands": [{"name": f"island-{i}", "region": REGIONS[i % 2],
                         "batch_size": batch_size} for i in range(islands)],
        }
        for name, values in sections.items():
            data[name] = {**data.get(name, {}), **values}
        return parse_config(data, REGIONS)

    return make
