"""The zoo's training text: GSM8K splits read straight from ``$SPECBENCH_DATA_DIR`` JSONL files
(plain ``json``, so a build needs no ``datasets`` package and no network), and the text formats.

The prompt format is the zero-shot one of :func:`specbench.datasets.format_gsm8k_prompt` with no
exemplars, so prompts at evaluation time are exact prefixes of the training documents.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from specbench.datasets import format_gsm8k_prompt

DATA_DIR_ENV = "SPECBENCH_DATA_DIR"
# fixed paths under the data directory, the same ones specbench.datasets reads
SPLIT_FILES = {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}
HUB_ID = "openai/gsm8k"  # named in the error only: builds run offline


@dataclass(frozen=True)
class Split:
    records: list[dict]  # {"question": str, "answer": str}
    path: Path
    sha256: str  # of the file's bytes, for the build record


def prompt_text(question: str) -> str:
    """The zero-shot GSM8K prompt, ``Question: <q>\\nAnswer:``: the prompt sets' own format, no shots."""
    return format_gsm8k_prompt(question, [])


def document_text(record: dict) -> str:
    """One training document, ``Question: <q>\\nAnswer: <a>``; the tokenizer appends EOS after it."""
    return f"{prompt_text(record['question'])} {record['answer']}"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """``data_dir`` or ``$SPECBENCH_DATA_DIR``; raises naming both when neither is given."""
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    if not chosen:
        raise FileNotFoundError(
            f"no GSM8K data directory: pass --data-dir or set {DATA_DIR_ENV} to a directory holding "
            f"{SPLIT_FILES['train']} and {SPLIT_FILES['test']} (the hub dataset {HUB_ID} is not used: "
            "zoo builds run offline)"
        )
    return Path(chosen).expanduser()


def read_split(data_dir: str | os.PathLike | None, split: str) -> Split:
    """All records of one GSM8K split; every line must hold string ``question`` and ``answer``."""
    if split not in SPLIT_FILES:
        raise ValueError(f"GSM8K split must be one of {sorted(SPLIT_FILES)}, got {split!r}")
    path = resolve_data_dir(data_dir) / SPLIT_FILES[split]
    if not path.is_file():
        raise FileNotFoundError(
            f"GSM8K {split} split not found at {path}; put the JSONL file there (fields question, answer; "
            f"it is the {HUB_ID} dataset, config main, split {split}) or point --data-dir / {DATA_DIR_ENV} "
            "at the directory that holds it. Zoo builds never download it."
        )
    raw = path.read_bytes()
    records = []
    for line_no, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {line_no}: invalid JSON ({err.msg}, column {err.colno})") from None
        for key in ("question", "answer"):
            if not isinstance(record, dict) or not isinstance(record.get(key), str):
                found = repr(record.get(key))[:60] if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{path}, line {line_no}: key {key!r} must be a string, found {found}")
        records.append({"question": record["question"], "answer": record["answer"]})
    if not records:
        raise ValueError(f"{path}: holds no records")
    return Split(records=records, path=path, sha256=hashlib.sha256(raw).hexdigest())
