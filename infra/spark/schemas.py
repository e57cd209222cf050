"""Schemas written once, as Arrow, and given to Spark as DDL derived from them."""

from __future__ import annotations

import pyarrow as pa

_DDL_TYPES = {
    pa.string(): "string",
    pa.binary(): "binary",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float64(): "double",
    pa.bool_(): "boolean",
}


def spark_ddl(schema: pa.Schema | list[tuple[str, pa.DataType]]) -> str:
    """The Spark DDL of an Arrow schema (or field list) of flat columns."""
    fields = schema if isinstance(schema, list) else [(field.name, field.type) for field in schema]
    try:
        return ", ".join(f"{name} {_DDL_TYPES[kind]}" for name, kind in fields)
    except KeyError as exc:
        raise TypeError(f"no Spark DDL for the Arrow type {exc.args[0]}") from None
