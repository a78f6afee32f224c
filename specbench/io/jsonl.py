"""The one JSON/JSON Lines reader: records with the file and line of every bad one, and JSON
decoding errors phrased for a person ("invalid JSON (Expecting value at column 3)")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def describe_json_error(err: json.JSONDecodeError) -> str:
    """``invalid JSON (<what> at column <n>)``; json's own messages for some errors already end in
    "at" ("Unterminated string starting at") and its position sits in separate fields."""
    what = err.msg[: -len(" at")] if err.msg.endswith(" at") else err.msg
    return f"invalid JSON ({what} at column {err.colno})"


def decode_text(raw: bytes, label: str, what: str = "JSON") -> str:
    """UTF-8 bytes as text; a binary or mis-encoded file is a ValueError naming it."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{label}: not UTF-8 text ({err.reason} at byte {err.start}); {what} files must be UTF-8") from None


def read_text(path: Path, label: str, what: str = "JSON") -> str:
    """A UTF-8 text file; a binary or mis-encoded one is a ValueError naming it."""
    return decode_text(Path(path).read_bytes(), label, what)


def iter_json_lines(text: str, label: str) -> Iterator[tuple[int, str, object]]:
    """(line number, location, value) for every non-blank line of JSON Lines ``text``."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{label}, line {line_no}: {describe_json_error(err)}") from None
            yield line_no, f"{label}, line {line_no}", value


def iter_json_records(path: Path, label: str | None = None) -> Iterator[tuple[str, dict]]:
    """(location, record) pairs of a file of JSON objects: one JSON array when it starts with ``[``,
    else JSON Lines. Anything but an object is an error naming its line or index."""
    label = label or str(path)
    text = read_text(path, label)
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{label}, line {err.lineno}: {describe_json_error(err)}") from None
        located = ((f"{label}, record {i}", r) for i, r in enumerate(records))
    else:
        located = ((where, value) for _, where, value in iter_json_lines(text, label))
    for where, record in located:
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, found {type(record).__name__}")
        yield where, record


def non_blank_line_numbers(path: Path) -> list[int]:
    """Line numbers of the non-blank lines: record i of a JSON Lines file sits on the i-th of them."""
    with open(path, encoding="utf-8") as f:
        return [n for n, line in enumerate(f, start=1) if line.strip()]
