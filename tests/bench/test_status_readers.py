"""The benchmarks that read a run's status (RunStore.status) read only fields its record
has (syncd.records.RunStatus, IslandStatus): a field renamed in syncd fails here, not as
a benchmark's figure gone quietly to None."""

from __future__ import annotations

import ast
from pathlib import Path

from syncd.records import IslandStatus, RunStatus

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _is_status(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` is a run's status: store.status(), `... or {}` of one, or a name
    bound to one."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _is_status(node.values[0], names)
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Attribute) and node.func.attr == "status" \
            and not node.args
    return isinstance(node, ast.Name) and node.id in names


def _key_read(node: ast.AST) -> tuple[ast.AST, str] | None:
    """(what is read, the key) for x["key"], x.get("key", ...) and "key" in x."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.value, node.slice.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "get" and node.args \
            and isinstance(node.args[0], ast.Constant):
        return node.func.value, node.args[0].value
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) \
            and isinstance(node.left, ast.Constant):
        return node.comparators[0], node.left.value
    return None


def status_reads(source: str) -> dict[str, set[str]]:
    """The fields a module reads of a run's status ("run") and of its islands
    ("island": the values of status["islands"] a for loop walks)."""
    tree = ast.parse(source)
    statuses = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and _is_status(node.value, set()) for target in node.targets
                if isinstance(target, ast.Name)}
    reads: dict[str, set[str]] = {"run": set(), "island": set()}
    for node in ast.walk(tree):
        read = _key_read(node)
        if read is not None and _is_status(read[0], statuses):
            reads["run"].add(read[1])
        if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) \
                and isinstance(node.iter, ast.Call) \
                and isinstance(node.iter.func, ast.Attribute) \
                and node.iter.func.attr == "items":
            walked = _key_read(node.iter.func.value)
            if walked and walked[1] == "islands" and _is_status(walked[0], statuses):
                reads["island"] |= _reads_of(node.target.elts[-1].id, node.body)
    return reads


def _reads_of(name: str, body: list[ast.stmt]) -> set[str]:
    """The keys `body` reads of the variable `name`."""
    return {read[1] for statement in body for node in ast.walk(statement)
            if (read := _key_read(node)) and isinstance(read[0], ast.Name)
            and read[0].id == name}


def test_the_benchmarks_read_only_fields_the_status_record_has():
    found = {path.name: status_reads(path.read_text()) for path in sorted(BENCH.glob("*.py"))}
    readers = {name for name, reads in found.items() if reads["run"]}

    assert {"goodput.py", "scale.py", "soak.py", "rejoin.py"} <= readers
    for name, reads in found.items():
        assert reads["run"] - set(RunStatus.__annotations__) == set(), name
        assert reads["island"] - set(IslandStatus.__annotations__) == set(), name


def test_a_read_of_a_field_the_record_lacks_is_found():
    source = """
status = store.status() or {}
alive = status.get("live_islands", 0)
for name, island in status.get("islands", {}).items():
    steps = island["steps"]
done = "outcome" in status or (store.status() or {}).get("finished")
"""

    assert status_reads(source) == {"run": {"live_islands", "islands", "outcome", "finished"},
                                    "island": {"steps"}}
