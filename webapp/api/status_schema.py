"""The API's schemas and the Prometheus metrics of syncd's run status, compiled from its
record (syncd.records.RunStatus): each field's type and help, so that the API, /metrics
and the run page read the same facts and none writes them out again.

webapp/api/schemas.py makes the run's, the island's and the metric point's schemas with
`from_record`; webapp/api/prometheus.py names its gauges and their help with `gauges`.
"""

from __future__ import annotations

import operator
import types
from collections.abc import Iterable
from functools import cache, reduce
from typing import Any, Union, get_args, get_origin, is_typeddict

from ninja import Field, Schema
from pydantic import create_model

from syncd.records import fields


def from_record(name: str, record: type, chosen: dict[str, Any], *,
                base: type[Schema] = Schema, doc: str | None = None) -> type[Schema]:
    """A schema `name` on `base` with the `chosen` fields of `record` (field -> its
    default, `...` for a required one): each with the record's type, or None besides
    where its default is None, and the record's help as its description."""
    described = _described(record, chosen)
    schema_fields: dict[str, Any] = {}
    for field, default in chosen.items():
        kind, help_text = described[field]
        kind = schema_type(kind)
        schema_fields[field] = (kind | None if default is None else kind,
                                Field(default, description=help_text or None))
    return create_model(name, __base__=base, __doc__=doc or record.__doc__, **schema_fields)


@cache
def record_schema(record: type) -> type[Schema]:
    """The whole of a record as a schema of the same name, every field required."""
    return from_record(record.__name__, record, dict.fromkeys(fields(record), ...))


def schema_type(kind: Any) -> Any:
    """`kind` with each record in it (a TypedDict) made a schema, however deep."""
    if is_typeddict(kind):
        return record_schema(kind)
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, types.UnionType):
        return reduce(operator.or_, [schema_type(a) for a in args])
    if origin in (list, dict):
        return origin[tuple(schema_type(a) for a in args)]
    return kind


def metric_name(prefix: str, field: str) -> str:
    """The gauge of a status field: `prefix` and the field, its unit spelled as
    Prometheus does (tokens_per_s -> tokens_per_second, slot_wait_s -> slot_wait_seconds)."""
    if field.endswith("_per_s"):
        field = field.removesuffix("_s") + "_second"
    elif field.endswith("_s"):
        field = field.removesuffix("_s") + "_seconds"
    return f"{prefix}_{field}"


def gauges(prefix: str, record: type, chosen: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """Gauge name -> (help, the field it reads), for the `chosen` fields of `record`."""
    described = _described(record, chosen)
    return {metric_name(prefix, field): (described[field][1], field) for field in chosen}


def _described(record: type, chosen: Iterable[str]) -> dict[str, tuple[Any, str]]:
    """The record's fields (syncd.records.fields); a ValueError when it lacks a chosen one."""
    described = fields(record)
    unknown = set(chosen) - set(described)
    if unknown:
        raise ValueError(f"{record.__name__} has no field {', '.join(sorted(unknown))}")
    return described
