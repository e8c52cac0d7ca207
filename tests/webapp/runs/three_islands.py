"""A run of three islands in two regions, for the tests of what the web app asks of a
running run (services, faults, tasks), and what its islands' supervisors are told."""

from syncd.store import RunStore

THREE_ISLANDS = {
    "sync": {"min_quorum": 2},
    "islands": [
        {"name": "east-a", "region": "us-east"},
        {"name": "east-b", "region": "us-east"},
        {"name": "west-a", "region": "us-west"},
    ],
}


def commands(store: RunStore, island: str) -> list[dict]:
    """The commands waiting for the island's supervisor, taken."""
    out = []
    while (command := store.signals.next_command(island)) is not None:
        out.append(command)
    return out
