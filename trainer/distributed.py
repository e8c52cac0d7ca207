"""Islands of several processes: one data-parallel group with torch.distributed.

An island may span several processes (GPUs) of one host. They form one
data-parallel group with torch.distributed (gloo on CPU, NCCL on GPU): every
rank holds the same model, takes an equal, disjoint part of each batch the
one-process island would draw, and DistributedDataParallel averages the
gradients, so the group takes the same steps as one process with the island's
whole batch. Rank 0 is the island as syncd sees it: it owns the link (sends,
pulls, heartbeats, the data cursor) and tells the other ranks by broadcast what
comes after each inner step: the next step, fragment p as rank 0 now holds it
(after a mix or an elastic reset), or stop. So the other ranks never talk to
Redis, and every rank holds the same parameters and fragment state.

The ranks are started with torchrun's environment (MASTER_ADDR, MASTER_PORT,
RANK, LOCAL_RANK, WORLD_SIZE); trainer/supervisor.py sets it.
"""

from __future__ import annotations

import gc
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from diloco.config_parse import config_from_spec
from diloco.data import run_corpus
from diloco.device import resolve_device
from diloco.fragments import run_fragments
from diloco.island import Island, initial_model
from syncd.environment import data_dir, whole

# Rank 0 may wait a long time between two broadcasts (for syncd's merge with
# tau = 0, through a pause); the others wait in the broadcast meanwhile. A dead
# rank closes its connections, which ends the others' wait at once with gloo.
COLLECTIVE_TIMEOUT = timedelta(days=1)
# What rank 0 announces: [kind, fragment, version, tokens, inner_steps, step]. A
# fragment's counts for FRAGMENT; the island's tokens and step for STEP.
STEP, FRAGMENT, STOP = 0, 1, 2


class IslandGroup:
    """The processes of one island, as a torch.distributed process group.

    Args:
        rank: this process's rank; rank 0 owns the island's link to syncd.
        world_size: the island's processes (islands[].processes).
        device: this process's device ("cpu", "cuda:N"): gloo on the CPU, NCCL on GPUs.
        init_method: where the ranks meet; default: MASTER_ADDR and MASTER_PORT.
    """

    def __init__(self, rank: int, world_size: int, device: str, init_method: str = "env://"):
        if world_size < 2:
            raise ValueError(f"an island group needs at least 2 processes, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be between 0 and {world_size - 1}, got {rank}")
        self.rank = rank
        self.world_size = world_size
        self.device = device
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank,
                                world_size=world_size, timeout=COLLECTIVE_TIMEOUT)

    @classmethod
    def from_env(cls, device_setting: str) -> IslandGroup:
        """The group of a process started with torchrun's environment variables."""
        rank = whole("RANK")
        local_rank = whole("LOCAL_RANK", rank)
        return cls(rank, whole("WORLD_SIZE"),
                   resolve_device(device_setting, local_rank))

    def close(self, island: Island | None = None) -> None:
        """Leave the group, the last thing a rank does.

        The island's DDP wrapper goes first. DDP sits in reference cycles, so
        without a collection it outlives the group to interpreter exit, where
        gloo then aborts the process now and then ("terminate called without an
        active exception"), and the supervisor takes a clean stop for a crash.
        """
        if island is not None:
            island.unwrap()
            gc.collect()
        dist.destroy_process_group()

    # -- data parallelism --------------------------------------------------------

    def wrap(self, model: torch.nn.Module) -> DistributedDataParallel:
        """The model for forward and backward; gradients come out averaged over the ranks."""
        ids = [torch.device(self.device).index] if self.device.startswith("cuda") else None
        return DistributedDataParallel(model, device_ids=ids)

    def part(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the island's batch."""
        size = len(batch) // self.world_size
        if size * self.world_size != len(batch):
            raise ValueError(f"a batch of {len(batch)} cannot be cut into {self.world_size} "
                             f"equal parts")
        return batch[self.rank * size:(self.rank + 1) * size]

    def mean(self, value: torch.Tensor) -> float:
        """The mean of a scalar over the ranks: the island's loss from each rank's part."""
        total = value.detach().float().clone()
        dist.all_reduce(total)
        return total.item() / self.world_size

    # -- rank 0 tells, the others follow -------------------------------------------

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (small things: the run spec, a data cursor)."""
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def announce_step(self, island: Island) -> None:
        """Rank 0: every rank trains its next inner step, from rank 0's step and token
        count (an elastic restart moves rank 0's step on; the learning rate follows it)."""
        self._announce(STEP, tokens=island.tokens, step=island.step)

    def announce_stop(self) -> None:
        """Rank 0: the island ends; every rank leaves follow()."""
        self._announce(STOP)

    def announce_fragment(self, island: Island, p: int) -> None:
        """Rank 0: every rank takes fragment p (parameters, anchor, counts) as rank 0 has it."""
        s = island.state[p]
        self._announce(FRAGMENT, p, s.version, s.tokens, s.inner_steps)
        self._broadcast_fragment(island, p)

    def follow(self, island: Island) -> None:
        """Ranks above 0: train and take fragments as rank 0 announces, until it stops."""
        while True:
            kind, p, version, tokens, inner_steps, step = self._announced()
            if kind == STOP:
                return
            if kind == STEP:
                island.move_to(step, tokens)
                island.inner_step()
                continue
            self._broadcast_fragment(island, p)
            island.set_fragment_counts(p, version, tokens, inner_steps)

    def share_start(self, island: Island) -> None:
        """Every rank, once the island is built: rank 0's data cursor and fragment state."""
        step, tokens, rng, counts = self.broadcast_object(
            (island.step, island.tokens, island.sampler.state(),
             [(s.version, s.tokens, s.inner_steps) for s in island.state]))
        island.move_to(step, tokens)
        island.sampler.set_state(rng)
        for p, (version, fragment_tokens, inner_steps) in enumerate(counts):
            island.set_fragment_counts(p, version, fragment_tokens, inner_steps)
            self._broadcast_fragment(island, p)

    def _announce(self, kind: int, p: int = 0, version: int = 0, tokens: int = 0,
                  inner_steps: int = 0, step: int = 0) -> None:
        if self.rank != 0:
            raise RuntimeError("only rank 0 of an island announces")
        dist.broadcast(torch.tensor([kind, p, version, tokens, inner_steps, step],
                                    device=self.device), src=0)

    def _announced(self) -> list[int]:
        message = torch.zeros(6, dtype=torch.int64, device=self.device)
        dist.broadcast(message, src=0)
        return message.tolist()

    @torch.no_grad()
    def _broadcast_fragment(self, island: Island, p: int) -> None:
        """Rank 0's parameters and anchor of fragment p, in place on every rank."""
        s = island.state[p]
        for n in island.fragments[p].tensor_names:
            dist.broadcast(island.params[n], src=0)
            dist.broadcast(s.anchor[n], src=0)


def follow_rank(group: IslandGroup, name: str) -> int:
    """A rank above 0 of island `name`: build the island from rank 0's spec and state,
    then train as rank 0 says until it says stop."""
    spec = group.broadcast_object(None)
    if spec is None:  # rank 0 stopped before the island was built
        group.close()
        return 0
    config = config_from_spec(spec)
    corpus = run_corpus(config.data, data_dir())
    # The parameters come from rank 0: DDP broadcasts them, then share_start does.
    island = Island(config.island_index(name), config, corpus, run_fragments(config),
                    initial_model(config).state_dict(), group.device, group)
    group.share_start(island)
    group.follow(island)
    group.close(island)
    return 0
