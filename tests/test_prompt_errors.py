"""Prompt-file and prompt-set errors read as sentences that name the file, the line and the fix.

A malformed JSONL line once read "invalid JSON (Unterminated string starting at, column 12)": json's
message ends in "at" and its position sits in separate fields. It now reads
"<file>, line N: invalid JSON (Unterminated string starting at column 12)". The offline
"prompt set unavailable" message once told a CLI user to "pass data_dir="; it now says to set
SPECBENCH_DATA_DIR and mentions data_dir= only as the Python equivalent.
"""

from __future__ import annotations

import pytest

from specbench.prompts import DATA_DIR_ENV, DatasetUnavailable, load_prompts
from specbench.prompts import sources

GOOD_LINE = '{"prompt": "What is 2 + 2?"}'


def _prompt_file(tmp_path, *lines: str):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _load_error(path) -> str:
    with pytest.raises(ValueError) as error:
        load_prompts(str(path))
    return str(error.value)


def test_unterminated_string_names_file_line_and_column(tmp_path):
    # line 3 (a blank line 2 still counts); the string opens at column 12: `{"prompt": ` is 11 characters
    path = _prompt_file(tmp_path, GOOD_LINE, "", '{"prompt": "never closed}')
    assert _load_error(path) == f"{path}, line 3: invalid JSON (Unterminated string starting at column 12)"


def test_missing_comma_names_file_line_and_column(tmp_path):
    # `{"prompt": "a" ` is 15 characters: json expects the ',' at column 16, where "id" starts
    path = _prompt_file(tmp_path, GOOD_LINE, '{"prompt": "a" "id": "x"}')
    assert _load_error(path) == f"{path}, line 2: invalid JSON (Expecting ',' delimiter at column 16)"


@pytest.mark.parametrize(
    ("line", "found"),
    [('"just a string"', "str"), ("[1, 2, 3]", "list"), ("42", "int"), ("null", "NoneType")],
)
def test_a_line_that_is_not_an_object_is_named(tmp_path, line, found):
    # line 2: a first line that is an array would make the whole file read as one JSON array
    path = _prompt_file(tmp_path, GOOD_LINE, line, GOOD_LINE)
    assert _load_error(path) == f"{path}, line 2: expected a JSON object, found {found}"


def test_a_valid_file_loads(tmp_path):
    """The same reader accepts the good lines around the bad ones above, blank lines skipped."""
    path = _prompt_file(tmp_path, GOOD_LINE, "", '{"prompt_token_ids": [5, 6], "id": "ids"}')
    prompt_set = load_prompts(str(path))
    assert [(p.id, p.text, p.token_ids) for p in prompt_set] == [("0", "What is 2 + 2?", None), ("ids", None, [5, 6])]
    assert prompt_set.source == "file" and prompt_set.origin == str(path.resolve())


def _offline(monkeypatch) -> str:
    """No data directory and no hub, whatever the environment this test runs in; returns the hub
    reason the message must carry. HF_HUB_OFFLINE is read at call time, but `datasets` reads it
    once at import: marking datasets itself online makes load_hub_split stop at the environment
    variable (its "set after import" branch) instead of consulting a local HF cache, so the message
    does not depend on what that cache happens to hold."""
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if sources.datasets is None:
        return "skipped, the `datasets` package is not installed (pip install datasets)"
    monkeypatch.setattr(sources.datasets.config, "HF_HUB_OFFLINE", False)
    return "skipped, HF_HUB_OFFLINE is set"


def test_offline_gsm8k_says_what_was_tried_and_how_to_fix_it(monkeypatch):
    hub_reason = _offline(monkeypatch)
    with pytest.raises(DatasetUnavailable) as error:
        load_prompts("gsm8k")
    message = str(error.value)
    assert message.startswith("prompt set 'gsm8k' is unavailable; tried: ")
    assert message == (
        f"prompt set 'gsm8k' is unavailable; tried: hub openai/gsm8k (config main, split test): {hub_reason}; "
        f"local copy: {DATA_DIR_ENV} is not set. To fix: set {DATA_DIR_ENV}=/path/to/data, a directory holding "
        "gsm8k/test.jsonl (from Python, load_prompts(..., data_dir=) does the same), or allow hub access "
        "(unset HF_HUB_OFFLINE)."
    )
    assert "set SPECBENCH_DATA_DIR=" in message
    assert "pass data_dir=" not in message  # the old advice, meaningless to a CLI user


def test_offline_gsm8k_with_a_data_dir_lacking_the_file_names_the_path(monkeypatch, tmp_path):
    hub_reason = _offline(monkeypatch)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(DatasetUnavailable) as error:
        load_prompts("gsm8k")
    assert str(error.value).startswith(
        f"prompt set 'gsm8k' is unavailable; tried: hub openai/gsm8k (config main, split test): {hub_reason}; "
        f"local copy: {tmp_path / 'gsm8k' / 'test.jsonl'} not found. To fix: set {DATA_DIR_ENV}=/path/to/data"
    )
