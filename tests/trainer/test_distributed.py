"""Islands of several processes: real gloo process groups on the CPU, and the device and
precision an island trains with."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from diloco.config import RunConfig
from diloco.config_parse import parse_config
from diloco.data import load_corpus
from diloco.fragments import partition
from diloco.island import Island, initial_model
from syncd.environment import data_dir
from trainer.distributed import IslandGroup
from trainer.launch import free_port, rank_env

REGIONS = ["us-east"]
STEPS_BEFORE_MIX = 3
STEPS_AFTER_MIX = 3
# After the mix the island's step jumps here, as an elastic restart rounds it up to a
# multiple of H; still in the warmup, so the learning rate jumps with it.
RESTARTED_AT = 10
WARMUP_STEPS = 20


def tiny_config(text_path: str, processes: int, precision: str = "fp32") -> RunConfig:
    return parse_config({
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"path": text_path},
        "sync": {"fragments": 2, "min_quorum": 1},
        "optim": {"inner_lr": 1e-2, "warmup_steps": WARMUP_STEPS},
        "eval": {"tokens": 256},
        "train": {"precision": precision},
        "islands": [{"name": "island-0", "region": "us-east", "batch_size": 4,
                     "processes": processes}],
    }, REGIONS)


def make_island(config: RunConfig, group: IslandGroup | None = None) -> Island:
    """An island that keeps, in island.inputs, the token rows of every forward pass."""
    init = initial_model(config).state_dict()
    fragments = partition({n: t.numel() for n, t in init.items()}, config.sync.fragments)
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
    island = Island(0, config, corpus, fragments, init, "cpu", group)
    island.inputs = []
    island.model.register_forward_pre_hook(
        lambda module, args: island.inputs.append(args[0].clone()))
    return island


def global_fragment(island: Island, p: int) -> dict[str, torch.Tensor]:
    """A stand-in for syncd's merge: the same on every run of the test."""
    g = torch.Generator().manual_seed(p)
    return {n: t.detach() + 0.01 * torch.randn(t.shape, generator=g)
            for n, t in island.fragment_params(p).items()}


def snapshot(island: Island, losses: list[float]) -> dict:
    return {"params": {n: t.detach().clone() for n, t in island.params.items()},
            "anchor": {n: t.clone() for s in island.state for n, t in s.anchor.items()},
            "versions": [s.version for s in island.state],
            "step": island.step, "tokens": island.tokens, "losses": losses,
            "inputs": island.inputs}


def train_one_process(config: RunConfig) -> dict:
    """The island as one process: steps, a send, a step of overlap, a mix, a jump of
    the step, more steps."""
    island = make_island(config)
    losses = [island.inner_step() for _ in range(STEPS_BEFORE_MIX)]
    island.make_update(0, "none")
    losses.append(island.inner_step())
    island.mix_global(0, global_fragment(island, 0), version=1)
    island.step = RESTARTED_AT
    losses += [island.inner_step() for _ in range(STEPS_AFTER_MIX)]
    return snapshot(island, losses)


def train_as_rank(rank: int, world_size: int, port: int, text_path: str, out: str) -> None:
    """One rank of a two-process island, driven as trainer/runner.py drives it."""
    os.environ.update(rank_env(rank, world_size, port))
    torch.set_num_threads(1)
    group = IslandGroup.from_env("cpu")
    island = make_island(tiny_config(text_path, world_size), group)
    group.share_start(island)
    if rank == 0:
        losses = []
        for _ in range(STEPS_BEFORE_MIX):
            group.announce_step(island)
            losses.append(island.inner_step())
        island.make_update(0, "none")
        group.announce_step(island)
        losses.append(island.inner_step())
        island.mix_global(0, global_fragment(island, 0), version=1)
        group.announce_fragment(island, 0)
        island.step = RESTARTED_AT
        for _ in range(STEPS_AFTER_MIX):
            group.announce_step(island)
            losses.append(island.inner_step())
        group.announce_stop()
    else:
        losses = []
        group.follow(island)
    torch.save(snapshot(island, losses), f"{out}/rank-{rank}.pt")
    group.close(island)


@pytest.fixture(scope="module")
def two_ranks(text_path, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(train_as_rank, args=(2, free_port(), text_path, str(out)), nprocs=2)
    return [torch.load(out / f"rank-{r}.pt") for r in range(2)]


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=0, atol=atol), n


def test_two_processes_train_as_one_process_with_the_same_global_batch(two_ranks, text_path):
    one = train_one_process(tiny_config(text_path, processes=1))

    rank0 = two_ranks[0]
    assert_close(rank0["params"], one["params"], atol=1e-5)
    assert_close(rank0["anchor"], one["anchor"], atol=1e-6)
    assert rank0["versions"] == one["versions"] == [1, 0]
    assert (rank0["step"], rank0["tokens"]) == (one["step"], one["tokens"])
    assert rank0["losses"] == pytest.approx(one["losses"], abs=1e-5)


def test_each_rank_trains_on_its_own_half_of_the_one_process_batch(two_ranks, text_path):
    one = train_one_process(tiny_config(text_path, processes=1))

    rank0, rank1 = two_ranks
    assert len(rank0["inputs"]) == len(rank1["inputs"]) == len(one["inputs"])
    for a, b, whole in zip(rank0["inputs"], rank1["inputs"], one["inputs"], strict=True):
        assert len(a) == len(b) == len(whole) // 2
        assert torch.equal(torch.cat([a, b]), whole)


def test_every_rank_holds_rank_0s_parameters_and_fragment_state(two_ranks):
    rank0, rank1 = two_ranks

    assert_close(rank1["params"], rank0["params"], atol=0)
    assert_close(rank1["anchor"], rank0["anchor"], atol=0)
    assert rank1["versions"] == rank0["versions"]
    assert (rank1["step"], rank1["tokens"]) == (rank0["step"], rank0["tokens"])


def test_an_island_checks_its_group_against_the_run_config(text_path):
    class Group:  # only its size is read before the check
        world_size = 2

    with pytest.raises(ValueError, match="has 1 processes in the run config, but its "
                                         "group has 2"):
        make_island(tiny_config(text_path, processes=1), Group())


# -- device and precision ----------------------------------------------------------


def test_bf16_autocasts_the_forward_pass_and_keeps_fp32_parameters(text_path):
    island = make_island(tiny_config(text_path, processes=1, precision="bf16"))
    seen = []
    island.model.blocks[0].mlp.c_fc.register_forward_hook(
        lambda module, inputs, output: seen.append(output.dtype))

    loss = island.inner_step()

    assert seen == [torch.bfloat16]
    assert torch.isfinite(torch.tensor(loss))
    assert all(p.dtype == torch.float32 for p in island.model.parameters())


def test_bf16_trains_close_to_fp32(text_path):
    fp32 = make_island(tiny_config(text_path, processes=1))
    bf16 = make_island(tiny_config(text_path, processes=1, precision="bf16"))

    for _ in range(5):
        loss32, loss16 = fp32.inner_step(), bf16.inner_step()

    assert loss16 == pytest.approx(loss32, rel=0.05)
    assert loss16 != loss32


def test_a_group_needs_two_processes_and_a_rank_among_them():
    with pytest.raises(ValueError, match="at least 2 processes, got 1"):
        IslandGroup(0, 1, "cpu")
    with pytest.raises(ValueError, match="rank must be between 0 and 1, got 2"):
        IslandGroup(2, 2, "cpu")


def test_only_rank_0_announces():
    group = object.__new__(IslandGroup)
    group.rank = 1

    with pytest.raises(RuntimeError, match="only rank 0"):
        group.announce_stop()
