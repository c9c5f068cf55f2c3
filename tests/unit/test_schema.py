"""Schemas: supported types, validation texts, defaults, Spark and JSON round trips, predicates."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import types as st

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError
from pyspark_kudu.schema import (
    ColumnSchema,
    Predicate,
    PredicateOp,
    Schema,
    type_from_str,
    type_to_str,
)

ALL_TYPES = [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(),
    pa.decimal128(38, 10), pa.decimal128(5, 0), pa.string(), pa.binary(), pa.bool_(),
    pa.timestamp("us"), pa.timestamp("us", tz="UTC"), pa.date32(),
]


def full_schema() -> Schema:
    return Schema(
        (
            ColumnSchema("k_str", "string", nullable=False),
            ColumnSchema("k_ts", pa.timestamp("us", tz="UTC"), nullable=False),
            ColumnSchema("i8", "int8", default=-1),
            ColumnSchema("i16", "int16"),
            ColumnSchema("i32", "int32", nullable=False, default=3),
            ColumnSchema("i64", "int64"),
            ColumnSchema("f", "float"),
            ColumnSchema("d", "double", default=2.5),
            ColumnSchema("dec", pa.decimal128(10, 3), default=Decimal("1.250")),
            ColumnSchema("bin", "binary", default=b"\x00\xff"),
            ColumnSchema("flag", "bool", default=True),
            ColumnSchema("ntz", pa.timestamp("us"), default=dt.datetime(2020, 2, 29, 1, 2, 3)),
            ColumnSchema("day", "date32", default=dt.date(1969, 12, 31)),
        ),
        ("k_str", "k_ts"),
    )


@pytest.mark.parametrize("t", ALL_TYPES, ids=str)
def test_every_supported_type_has_a_stable_text_form(t: pa.DataType) -> None:
    assert type_from_str(type_to_str(t)) == t
    ColumnSchema("c", t)


@pytest.mark.parametrize("t, message", [
    (pa.list_(pa.int32()), "unsupported type list<item: int32>"),
    (pa.large_string(), "unsupported type large_string"),
    (pa.timestamp("ns"), "cast the data to pa.timestamp('us')"),
    (pa.decimal256(40, 2), "unsupported type decimal256"),
    ("uuid", "unsupported column type 'uuid'"),
])
def test_unsupported_types_are_rejected_with_the_supported_list(t: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"supported are|cast the data") as e:
        ColumnSchema("c", t)  # type: ignore[arg-type]
    assert message in str(e.value)


@pytest.mark.parametrize("columns, key, message", [
    ((ColumnSchema("a", "int64", nullable=False),), (), "schema has no primary key"),
    ((ColumnSchema("a", "int64"),), ("a",), "primary key column 'a' is nullable"),
    ((ColumnSchema("a", "int64", nullable=False), ColumnSchema("a", "string")), ("a",),
     "duplicate column name 'a'"),
    ((ColumnSchema("a", "int64", nullable=False),), ("b",), "primary key column 'b' is not in"),
    ((ColumnSchema("a", "double", nullable=False),), ("a",), "may not be bool, float or double"),
    ((ColumnSchema("a", "int64", nullable=False),), ("a", "a"), "names a column twice"),
    ((), ("a",), "at least one column"),
])
def test_invalid_schemas_are_rejected_with_clear_texts(
        columns: tuple[ColumnSchema, ...], key: tuple[str, ...], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        Schema(columns, key)
    assert message in str(e.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "", "type": "int8"}, "non-empty string"),
    ({"name": "__kudu_ts", "type": "int8"}, "reserved prefix"),
    ({"name": "x", "type": "int8", "default": 300}, "default 300 is not a valid int8"),
    ({"name": "x", "type": "decimal128(50, 2)"}, "precision 50 in 'decimal128(50, 2)' is out"),
])
def test_invalid_columns_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        ColumnSchema(**kwargs)  # type: ignore[arg-type]
    assert message in str(e.value)


def test_json_round_trip_keeps_types_nullability_defaults_and_key() -> None:
    s = full_schema()
    assert Schema.from_json(s.to_json()) == s
    assert Schema.from_json(s.to_json()).column("ntz").default == dt.datetime(2020, 2, 29, 1, 2, 3)


def test_spark_round_trip_keeps_types_nullability_and_key() -> None:
    s = full_schema()
    struct = s.to_spark()
    assert struct["k_ts"].dataType == st.TimestampType()
    assert struct["ntz"].dataType == st.TimestampNTZType()
    assert struct["dec"].dataType == st.DecimalType(10, 3)
    assert struct["i32"].nullable is False and struct["k_str"].metadata == {"kudu.key": True}
    back = Schema.from_spark(struct, defaults={c.name: c.default for c in s.columns})
    assert back == s


def test_from_spark_takes_an_explicit_key_and_makes_it_non_null() -> None:
    struct = st.StructType([st.StructField("id", st.LongType(), True),
                            st.StructField("v", st.StringType(), True)])
    s = Schema.from_spark(struct, primary_key=["id"])
    assert s.primary_key == ("id",) and not s.column("id").nullable


def test_from_spark_rejects_nested_types_naming_the_column() -> None:
    struct = st.StructType([st.StructField("id", st.LongType(), False),
                            st.StructField("tags", st.ArrayType(st.StringType()))])
    with pytest.raises(InvalidArgumentError, match="column 'tags' has unsupported Spark type"):
        Schema.from_spark(struct, ["id"])


def test_from_arrow_and_projection() -> None:
    s = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"])
    assert s.arrow_schema == pa.schema([pa.field("id", pa.int64(), nullable=False),
                                        pa.field("v", pa.string())])
    assert s.project(["v"]).names == ["v"]
    with pytest.raises(NotFoundError, match="column 'zz' not found"):
        s.project(["zz"])


def test_default_array_fills_the_default_or_nulls() -> None:
    s = full_schema()
    assert s.column("dec").default_array(2).to_pylist() == [Decimal("1.250")] * 2
    assert s.column("i16").default_array(1).to_pylist() == [None]


def test_predicates_bind_values_to_the_column_type_and_filter_like_sql() -> None:
    s = Schema.from_arrow(pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"])
    table = pa.table({"id": [1, 2, 3], "v": ["a", None, "c"]})
    assert Predicate.eq("id", 2).bind(s).value == 2
    with pytest.raises(InvalidArgumentError, match="'x' is not a valid int64 for column 'id'"):
        Predicate.eq("id", "x").bind(s)
    with pytest.raises(InvalidArgumentError, match="needs a list"):
        Predicate("id", PredicateOp.IN, 5)
    with pytest.raises(InvalidArgumentError, match=r"use Predicate\.is_null"):
        Predicate.eq("v", None)
    cases = {
        Predicate.ne("v", "a"): [3], Predicate.is_null("v"): [2],
        Predicate.in_("v", ["a", "c", None]): [1, 3], Predicate.ge("id", 2): [2, 3],
    }
    for p, want in cases.items():
        assert table.filter(p.to_expression(s)).column("id").to_pylist() == want
    assert str(Predicate.is_not_null("v")) == "v IS NOT NULL"
