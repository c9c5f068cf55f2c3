"""Table schemas: Arrow-typed columns, a composite primary key, defaults, Spark conversion.

Rules (Kudu's, checked when a :class:`Schema` is built):

- Column types are the Kudu-representable Arrow types: ``int8..int64``, ``float``
  (float32), ``double``, ``decimal128(p, s)`` with ``1 <= p <= 38``, ``string``, ``binary``,
  ``bool``, ``timestamp('us'[, tz])`` (Kudu's ``UNIXTIME_MICROS``) and ``date32``.
- A primary key of one or more distinct, non-null columns is required. Key columns may not be
  ``bool``, ``float`` or ``double`` (Kudu rejects those as key types as well).
- Column names are unique and non-empty; names starting with ``__kudu_`` are reserved for the
  storage engine's own columns.
- A default must be representable in the column's type (``None`` means "no default").

The module also defines :class:`Predicate`, a condition on one column (comparison, ``IN``,
``IS [NOT] NULL``), because pruning (:mod:`pyspark_kudu.partitioning`) and replica scans
(:mod:`pyspark_kudu.tablet`) both consume it; like Kudu's ``ColumnPredicate`` it lives next to
the schema it is bound to.

Thread-safety: every class here is immutable after construction and safe to share.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError

if TYPE_CHECKING:  # pragma: no cover - only for annotations; pyspark is imported lazily
    # (and pyarrow.dataset, which imports pandas: ~0.15 s for a process that needs neither,
    # e.g. the driver's Python worker planning a ``format("kudu")`` write)
    import pyarrow.dataset as ds
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "ARROW_CAST_ERRORS",
    "RESERVED_PREFIX",
    "ColumnSchema",
    "Predicate",
    "PredicateOp",
    "Schema",
    "type_family",
    "type_from_str",
    "type_to_str",
    "values_from_json",
    "values_to_json",
]

ARROW_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
"""What ``Array.cast`` raises for values that do not fit the target type."""

RESERVED_PREFIX = "__kudu_"
"""Column-name prefix reserved for the storage engine (MVCC timestamps, row positions)."""

_FIXED_TYPES: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "bool": pa.bool_(),
    "date32": pa.date32(),
}
_DECIMAL_RE = re.compile(r"^decimal(?:128)?\((\d+),\s*(-?\d+)\)$")
_TIMESTAMP_RE = re.compile(r"^timestamp\[us(?:,\s*tz=(.+))?\]$")
_SUPPORTED_TEXT = (
    "int8, int16, int32, int64, float, double, decimal128(p, s), string, binary, bool, "
    "timestamp('us'[, tz]), date32"
)


def type_to_str(t: pa.DataType) -> str:
    """Stable text form of a supported type (used in the superblock and error messages)."""
    for name, ft in _FIXED_TYPES.items():
        if t == ft:
            return name
    if pa.types.is_decimal128(t):
        return f"decimal128({t.precision}, {t.scale})"
    if pa.types.is_timestamp(t):
        return f"timestamp[us, tz={t.tz}]" if t.tz else "timestamp[us]"
    return str(t)


def type_from_str(text: str) -> pa.DataType:
    """Inverse of :func:`type_to_str`; also accepts the aliases ``float32``/``float64``."""
    text = text.strip()
    aliases = {"float32": "float", "float64": "double", "boolean": "bool", "utf8": "string"}
    text = aliases.get(text, text)
    if text in _FIXED_TYPES:
        return _FIXED_TYPES[text]
    m = _DECIMAL_RE.match(text)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= 38:
            raise InvalidArgumentError(
                f"decimal precision {precision} in {text!r} is out of range; use 1..38"
            )
        return pa.decimal128(precision, scale)
    m = _TIMESTAMP_RE.match(text)
    if m:
        return pa.timestamp("us", tz=m.group(1))
    raise InvalidArgumentError(f"unsupported column type {text!r}: supported are {_SUPPORTED_TEXT}")


def type_family(t: pa.DataType, *, exact_numbers: bool = False) -> str:
    """The family of a type for implicit conversions of written values: ``numeric``
    (integers, floats, decimals), ``string``, ``binary``, ``bool``, ``date``, ``timestamp``
    (any unit or zone); other types are their own family. ``exact_numbers`` splits
    ``numeric`` into ``integer``, ``floating`` and ``decimal`` (for key columns, whose
    values route rows and must not be rounded)."""
    if pa.types.is_integer(t):
        return "integer" if exact_numbers else "numeric"
    if pa.types.is_floating(t):
        return "floating" if exact_numbers else "numeric"
    if pa.types.is_decimal(t):
        return "decimal" if exact_numbers else "numeric"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return str(t)


def _check_type(column: str, t: pa.DataType) -> None:
    if any(t == ft for ft in _FIXED_TYPES.values()):
        return
    if pa.types.is_decimal128(t):
        return
    if pa.types.is_timestamp(t):
        if t.unit != "us":
            raise InvalidArgumentError(
                f"column {column!r} has type {t}: timestamps are stored in microseconds; "
                f"cast the data to pa.timestamp('us'{', tz=' + repr(t.tz) if t.tz else ''})"
            )
        return
    raise InvalidArgumentError(
        f"column {column!r} has unsupported type {t}: supported are {_SUPPORTED_TEXT}"
    )


def _is_key_capable(t: pa.DataType) -> bool:
    return not (pa.types.is_boolean(t) or pa.types.is_floating(t))


# -- JSON form of typed values (defaults, key bounds in the superblock) --------------------


def values_to_json(t: pa.DataType, values: Sequence[Any] | pa.Array) -> list[Any]:
    """Encode values of type ``t`` as JSON-safe scalars: exact, and decodable without loss.

    Timestamps and dates travel as their integer Arrow representation, decimals as strings,
    binary as hex, so no time zone or float rounding can change a key bound.
    """
    arr = values if isinstance(values, pa.Array) else pa.array(list(values), type=t)
    if pa.types.is_timestamp(t):
        return list(arr.cast(pa.int64()).to_pylist())
    if pa.types.is_date32(t):
        return list(arr.cast(pa.int32()).to_pylist())
    if pa.types.is_decimal(t):
        return [None if v is None else str(v) for v in arr.to_pylist()]
    if pa.types.is_binary(t):
        return [None if v is None else v.hex() for v in arr.to_pylist()]
    return list(arr.to_pylist())


def values_from_json(t: pa.DataType, values: Sequence[Any]) -> pa.Array:
    """Inverse of :func:`values_to_json`, returning an Arrow array of type ``t``."""
    if pa.types.is_timestamp(t):
        return pa.array(values, type=pa.int64()).cast(t)
    if pa.types.is_date32(t):
        return pa.array(values, type=pa.int32()).cast(t)
    if pa.types.is_decimal(t):
        return pa.array([None if v is None else Decimal(v) for v in values], type=t)
    if pa.types.is_binary(t):
        return pa.array([None if v is None else bytes.fromhex(v) for v in values], type=t)
    return pa.array(values, type=t)


# -- columns and schemas ------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnSchema:
    """One column: name, Arrow type (a type or its text form), nullability, optional default.

    ``default`` is a Python value of the column's type (``None`` = no default). It is applied
    to rows inserted without the column; ``has_default`` says whether one is set.
    """

    name: str
    type: pa.DataType
    nullable: bool = True
    default: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"column name must be a non-empty string, got {self.name!r}")
        if self.name.startswith(RESERVED_PREFIX):
            raise InvalidArgumentError(
                f"column name {self.name!r} uses the reserved prefix {RESERVED_PREFIX!r}; rename it"
            )
        t = self.type
        if isinstance(t, str):
            t = type_from_str(t)
            object.__setattr__(self, "type", t)
        if not isinstance(t, pa.DataType):
            raise InvalidArgumentError(
                f"column {self.name!r}: type must be a pyarrow DataType or its name, got {t!r}"
            )
        _check_type(self.name, t)
        if self.default is not None:
            try:
                scalar = pa.scalar(self.default, type=t)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                raise InvalidArgumentError(
                    f"column {self.name!r}: default {self.default!r} is not a valid"
                    f" {type_to_str(t)} value ({e}); give a default of the column's type"
                ) from e
            object.__setattr__(self, "default", scalar.as_py())

    @property
    def has_default(self) -> bool:
        return self.default is not None

    def arrow_field(self) -> pa.Field:
        return pa.field(self.name, self.type, nullable=self.nullable)

    def default_array(self, length: int) -> pa.Array:
        """``length`` copies of the default (nulls when the column has none)."""
        if self.default is None:
            return pa.nulls(length, type=self.type)
        return pa.repeat(pa.scalar(self.default, type=self.type), length)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "type": type_to_str(self.type),
                             "nullable": self.nullable}
        if self.default is not None:
            d["default"] = values_to_json(self.type, [self.default])[0]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ColumnSchema:
        t = type_from_str(d["type"])
        default = None
        if d.get("default") is not None:
            default = values_from_json(t, [d["default"]])[0].as_py()
        return cls(d["name"], t, bool(d.get("nullable", True)), default)


@dataclass(frozen=True)
class Schema:
    """An ordered set of columns plus the primary key (column names, in key order).

    Key columns may appear anywhere in ``columns``; rows are ordered by the key columns in
    ``primary_key`` order. Build one directly, or with :meth:`from_arrow` / :meth:`from_spark`.
    """

    columns: tuple[ColumnSchema, ...]
    primary_key: tuple[str, ...]
    _by_name: dict[str, ColumnSchema] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cols = tuple(self.columns)
        key = (self.primary_key,) if isinstance(self.primary_key, str) else tuple(self.primary_key)
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "primary_key", key)
        if not cols:
            raise InvalidArgumentError("a schema needs at least one column")
        by_name: dict[str, ColumnSchema] = {}
        for c in cols:
            if c.name in by_name:
                raise InvalidArgumentError(
                    f"duplicate column name {c.name!r}: every column needs a unique name"
                )
            by_name[c.name] = c
        object.__setattr__(self, "_by_name", by_name)
        if not key:
            raise InvalidArgumentError(
                "schema has no primary key: name one or more non-null columns in primary_key"
            )
        if len(set(key)) != len(key):
            raise InvalidArgumentError(f"primary key {list(key)} names a column twice")
        for k in key:
            if k not in by_name:
                raise InvalidArgumentError(
                    f"primary key column {k!r} is not in the schema (columns: {self.names})"
                )
            c = by_name[k]
            if c.nullable:
                raise InvalidArgumentError(
                    f"primary key column {k!r} is nullable: declare it with nullable=False"
                )
            if not _is_key_capable(c.type):
                raise InvalidArgumentError(
                    f"primary key column {k!r} has type {type_to_str(c.type)}: key columns may"
                    " not be bool, float or double"
                )

    # -- lookups ----------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def key_columns(self) -> list[ColumnSchema]:
        return [self._by_name[k] for k in self.primary_key]

    def column(self, name: str) -> ColumnSchema:
        try:
            return self._by_name[name]
        except KeyError:
            raise NotFoundError(
                f"column {name!r} not found in schema (columns: {self.names})"
            ) from None

    def has_column(self, name: str) -> bool:
        return name in self._by_name

    def is_key(self, name: str) -> bool:
        return name in self.primary_key

    # -- Arrow -------------------------------------------------------------------------
    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([c.arrow_field() for c in self.columns])

    def project(self, columns: Sequence[str] | None) -> pa.Schema:
        """The Arrow schema of a projection (``None`` = all columns), validating the names."""
        if columns is None:
            return self.arrow_schema
        if len(set(columns)) != len(columns):
            raise InvalidArgumentError(f"projection {list(columns)} names a column twice")
        return pa.schema([self.column(n).arrow_field() for n in columns])

    @classmethod
    def from_arrow(cls, schema: pa.Schema, primary_key: Sequence[str],
                   defaults: Mapping[str, Any] | None = None) -> Schema:
        """Columns from an Arrow schema; key columns become non-null whatever the field says."""
        defaults = defaults or {}
        key = list(primary_key)
        cols = [ColumnSchema(f.name, f.type, f.nullable and f.name not in key,
                             defaults.get(f.name)) for f in schema]
        return cls(tuple(cols), tuple(key))

    # -- Spark ------------------------------------------------------------------------
    def to_spark(self) -> StructType:
        """The Spark ``StructType``; key fields carry ``{"kudu.key": true}`` metadata."""
        from pyspark.sql.types import StructField, StructType

        return StructType([
            StructField(c.name, _to_spark_type(c.type), c.nullable,
                        {"kudu.key": True} if self.is_key(c.name) else {})
            for c in self.columns
        ])

    @classmethod
    def from_spark(cls, struct: StructType, primary_key: Sequence[str] | None = None,
                   defaults: Mapping[str, Any] | None = None) -> Schema:
        """Schema from a Spark ``StructType``.

        ``primary_key`` defaults to the fields marked ``kudu.key`` in their metadata (as
        :meth:`to_spark` writes them), in field order.
        """
        if primary_key is None:
            primary_key = [f.name for f in struct.fields if (f.metadata or {}).get("kudu.key")]
        key = list(primary_key)
        defaults = defaults or {}
        cols = [ColumnSchema(f.name, _from_spark_type(f.name, f.dataType),
                             f.nullable and f.name not in key, defaults.get(f.name))
                for f in struct.fields]
        return cls(tuple(cols), tuple(key))

    def check_write_types(self, struct: StructType, table: str) -> None:
        """Check a DataFrame's column types before writing it to this table (driver side).

        A DataFrame column of a table column must be of the same :func:`type_family`
        (key columns: the same exact family, so an integer key never receives rounded
        floats); columns the table lacks are left to the column-name check.

        Raises:
            InvalidArgumentError: naming the column, both types and the fix; nothing is
                written.
        """
        for f in struct.fields:
            if not self.has_column(f.name):
                continue
            want = self.column(f.name).type
            exact = self.is_key(f.name)
            got = _from_spark_type(f.name, f.dataType)
            if type_family(got, exact_numbers=exact) != type_family(want, exact_numbers=exact):
                raise InvalidArgumentError(
                    f"table {table}: DataFrame column {f.name!r} has type "
                    f"{f.dataType.simpleString()}, the table column is {type_to_str(want)}"
                    f"{' (a primary key column)' if exact else ''}; cast it first, e.g. "
                    f"df.withColumn({f.name!r}, df[{f.name!r}].cast("
                    f"{_to_spark_type(want).simpleString()!r}))")

    # -- persistence ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"columns": [c.to_dict() for c in self.columns],
                "primary_key": list(self.primary_key)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Schema:
        return cls(tuple(ColumnSchema.from_dict(c) for c in d["columns"]),
                   tuple(d["primary_key"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Schema:
        return cls.from_dict(json.loads(text))


def _to_spark_type(t: pa.DataType) -> DataType:
    from pyspark.sql import types as st

    simple: list[tuple[pa.DataType, Any]] = [
        (pa.int8(), st.ByteType), (pa.int16(), st.ShortType), (pa.int32(), st.IntegerType),
        (pa.int64(), st.LongType), (pa.float32(), st.FloatType), (pa.float64(), st.DoubleType),
        (pa.string(), st.StringType), (pa.binary(), st.BinaryType), (pa.bool_(), st.BooleanType),
        (pa.date32(), st.DateType),
    ]
    for at, spark_cls in simple:
        if t == at:
            return spark_cls()  # type: ignore[no-any-return]
    if pa.types.is_decimal128(t):
        return st.DecimalType(t.precision, t.scale)
    if pa.types.is_timestamp(t):
        # Spark's TimestampType is an instant (UTC-normalised); without tz it is wall time.
        return st.TimestampType() if t.tz else st.TimestampNTZType()
    raise InvalidArgumentError(f"type {t} has no Spark equivalent")  # pragma: no cover


def _from_spark_type(column: str, dt: DataType) -> pa.DataType:
    from pyspark.sql import types as st

    mapping: list[tuple[type, pa.DataType]] = [
        (st.ByteType, pa.int8()), (st.ShortType, pa.int16()), (st.IntegerType, pa.int32()),
        (st.LongType, pa.int64()), (st.FloatType, pa.float32()), (st.DoubleType, pa.float64()),
        (st.StringType, pa.string()), (st.BinaryType, pa.binary()),
        (st.BooleanType, pa.bool_()), (st.DateType, pa.date32()),
        (st.TimestampNTZType, pa.timestamp("us")), (st.TimestampType, pa.timestamp("us", "UTC")),
    ]
    for spark_cls, at in mapping:
        if type(dt) is spark_cls:
            return at
    if isinstance(dt, st.DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    raise InvalidArgumentError(
        f"column {column!r} has unsupported Spark type {dt.simpleString()}: supported are "
        "byte, short, int, long, float, double, decimal, string, binary, boolean, timestamp, "
        "timestamp_ntz, date"
    )


# -- predicates ---------------------------------------------------------------------------


class PredicateOp(str, enum.Enum):
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    IN = "in"
    IS_NULL = "is_null"
    IS_NOT_NULL = "is_not_null"


_COMPARISONS = {PredicateOp.EQ, PredicateOp.NE, PredicateOp.LT, PredicateOp.LE,
                PredicateOp.GT, PredicateOp.GE}


@dataclass(frozen=True)
class Predicate:
    """A condition on one column, with SQL semantics: a null never satisfies a comparison.

    Build with the class methods (``Predicate.eq("id", 5)``, ``Predicate.in_("k", [1, 2])``,
    ``Predicate.is_null("v")`` ...). :meth:`bind` checks it against a schema and converts the
    value(s) to the column's type; :meth:`to_expression` gives the pyarrow expression that
    scans push into Parquet row-group pruning and filtering.
    """

    column: str
    op: PredicateOp
    value: Any = None

    def __post_init__(self) -> None:
        op = PredicateOp(self.op)
        object.__setattr__(self, "op", op)
        if op is PredicateOp.IN:
            if isinstance(self.value, (str, bytes)) or not isinstance(self.value, Iterable):
                raise InvalidArgumentError(
                    f"IN predicate on {self.column!r} needs a list of values, got {self.value!r}"
                )
            object.__setattr__(self, "value", tuple(self.value))
        elif op in _COMPARISONS and self.value is None:
            raise InvalidArgumentError(
                f"predicate {self.column!r} {op.value} None never matches: use"
                " Predicate.is_null / is_not_null to test for nulls"
            )

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def eq(cls, column: str, value: Any) -> Predicate:
        return cls(column, PredicateOp.EQ, value)

    @classmethod
    def ne(cls, column: str, value: Any) -> Predicate:
        return cls(column, PredicateOp.NE, value)

    @classmethod
    def lt(cls, column: str, value: Any) -> Predicate:
        return cls(column, PredicateOp.LT, value)

    @classmethod
    def le(cls, column: str, value: Any) -> Predicate:
        return cls(column, PredicateOp.LE, value)

    @classmethod
    def gt(cls, column: str, value: Any) -> Predicate:
        return cls(column, PredicateOp.GT, value)

    @classmethod
    def ge(cls, column: str, value: Any) -> Predicate:
        return cls(column, PredicateOp.GE, value)

    @classmethod
    def in_(cls, column: str, values: Iterable[Any]) -> Predicate:
        return cls(column, PredicateOp.IN, tuple(values))

    @classmethod
    def is_null(cls, column: str) -> Predicate:
        return cls(column, PredicateOp.IS_NULL)

    @classmethod
    def is_not_null(cls, column: str) -> Predicate:
        return cls(column, PredicateOp.IS_NOT_NULL)

    # -- binding ------------------------------------------------------------------------
    def bind(self, schema: Schema) -> Predicate:
        """This predicate with its value(s) converted to the column's type.

        Raises:
            NotFoundError: the column is not in ``schema``.
            InvalidArgumentError: a value is not representable in the column's type.
        """
        col = schema.column(self.column)
        if self.op is PredicateOp.IN:
            vals = tuple(_coerce(col, v) for v in self.value if v is not None)
            return Predicate(self.column, self.op, vals)
        if self.op in _COMPARISONS:
            return Predicate(self.column, self.op, _coerce(col, self.value))
        return self

    def to_expression(self, schema: Schema) -> ds.Expression:
        col = schema.column(self.column)
        f = pc.field(self.column)
        op = self.op
        if op is PredicateOp.IS_NULL:
            return f.is_null()
        if op is PredicateOp.IS_NOT_NULL:
            return f.is_valid()
        if op is PredicateOp.IN:
            values = pa.array([_coerce(col, v) for v in self.value if v is not None], type=col.type)
            return f.isin(values)
        s = pa.scalar(_coerce(col, self.value), type=col.type)
        exprs = {
            PredicateOp.EQ: lambda: f == s, PredicateOp.NE: lambda: f != s,
            PredicateOp.LT: lambda: f < s, PredicateOp.LE: lambda: f <= s,
            PredicateOp.GT: lambda: f > s, PredicateOp.GE: lambda: f >= s,
        }
        return exprs[op]()

    def __str__(self) -> str:
        if self.op in (PredicateOp.IS_NULL, PredicateOp.IS_NOT_NULL):
            return f"{self.column} {self.op.value.replace('_', ' ').upper()}"
        return f"{self.column} {self.op.value.upper()} {self.value!r}"


def _coerce(col: ColumnSchema, value: Any) -> Any:
    try:
        return pa.scalar(value, type=col.type).as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
        raise InvalidArgumentError(
            f"predicate value {value!r} is not a valid {type_to_str(col.type)} for column"
            f" {col.name!r} ({e})"
        ) from e
