"""Identifier validation: table and column names that can never reach a path or a URL badly."""

from __future__ import annotations

import pytest

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.entities import MAX_IDENTIFIER_BYTES, validate_identifier


@pytest.mark.parametrize("name", ["t", "my_table", "db.events", "événements", "a" * 256, "x-1 y"])
def test_ordinary_names_are_accepted(name: str) -> None:
    assert validate_identifier("table", name) == name


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("", "must not be empty"),
        ("a/b", "path separator '/'"),
        ("a\\b", "path separator"),
        ("..", "contain '..'"),
        ("a..b", "contain '..'"),
        (".", "may not be '.'"),
        ("a\x00b", "control characters"),
        ("tab\there", "control characters"),
        ("a" * (MAX_IDENTIFIER_BYTES + 1), "longer than maximum permitted length 256"),
        ("é" * 129, "longer than maximum permitted length"),
        (7, "must be a string"),
    ],
)
def test_bad_names_are_refused_with_the_rule_they_break(name: object, text: str) -> None:
    with pytest.raises(InvalidArgumentError, match=text) as info:
        validate_identifier("table", name)
    assert "table name" in str(info.value)
