"""GSM8K prompts: n-shot text prompts (exemplars from the train split, never the test split), hub
first, then the local data directory; and whole splits for the zoo's training text."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from specbench.io.jsonl import decode_text, iter_json_lines, non_blank_line_numbers
from specbench.prompts import sources
from specbench.prompts.records import DatasetUnavailable, Prompt, PromptSet

GSM8K_HUB_ID, GSM8K_HUB_CONFIG = "openai/gsm8k", "main"
# Fixed relative paths under the data directory; names are never joined into paths.
GSM8K_TEST_FILE, GSM8K_TRAIN_FILE = "gsm8k/test.jsonl", "gsm8k/train.jsonl"
SPLIT_FILES = {"train": GSM8K_TRAIN_FILE, "test": GSM8K_TEST_FILE}

# Used only when no GSM8K train split is reachable: it is train record 0 (openai/grade-school-math,
# MIT), so a 1-shot prompt is the same text whether or not the train split was found.
FALLBACK_GSM8K_EXEMPLAR = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
    "altogether in April and May.\n#### 72",
}


def format_gsm8k_prompt(question: str, exemplars: list[dict]) -> str:
    """Worked examples as ``Question: ...\\nAnswer: ...\\n\\n``, then ``Question: <q>\\nAnswer:``."""
    shots = "".join(f"Question: {ex['question']}\nAnswer: {ex['answer']}\n\n" for ex in exemplars)
    return f"{shots}Question: {question}\nAnswer:"


def load_gsm8k(n_shot: int, num_prompts: int | None, data_dir: str | None) -> PromptSet:
    tried: list[str] = []
    found = _gsm8k_split("test", GSM8K_TEST_FILE, data_dir, tried)
    if found is None:
        raise DatasetUnavailable(sources.unavailable_message("gsm8k", tried, GSM8K_TEST_FILE))
    rows, source, origin = found
    notes = [f"not used: {t}" for t in tried]
    exemplars = _gsm8k_exemplars(n_shot, data_dir, notes) if n_shot else []
    prompts = [
        Prompt(id=str(i), category="gsm8k", text=format_gsm8k_prompt(row["question"], exemplars))
        for i, row in enumerate(rows[:num_prompts])
    ]
    return PromptSet("gsm8k", source, prompts, origin=origin, n_shot=n_shot, notes=tuple(notes))


def _gsm8k_exemplars(n_shot: int, data_dir: str | None, notes: list[str]) -> list[dict]:
    """The first ``n_shot`` records of the train split, never of the test split."""
    tried: list[str] = []
    found = _gsm8k_split("train", GSM8K_TRAIN_FILE, data_dir, tried)
    if found is None:
        if n_shot > 1:
            raise DatasetUnavailable(
                sources.unavailable_message(f"gsm8k {n_shot}-shot exemplars", tried, GSM8K_TRAIN_FILE)
                + " Only a 1-shot prompt can fall back to the built-in exemplar."
            )
        notes.append(f"no GSM8K train split reachable ({'; '.join(tried)}); used the built-in exemplar (train record 0)")
        return [FALLBACK_GSM8K_EXEMPLAR]
    rows, _, origin = found
    if len(rows) < n_shot:
        raise ValueError(f"n_shot={n_shot} but the GSM8K train split ({origin}) holds only {len(rows)} records")
    return rows[:n_shot]


def _gsm8k_split(split: str, relative: str, data_dir: str | None, tried: list[str]) -> tuple[list[dict], str, str] | None:
    """(records, source, origin) of one GSM8K split, hub first; None when neither place has it,
    with what was tried appended to ``tried``."""
    hub_label = f"hub {GSM8K_HUB_ID} (config {GSM8K_HUB_CONFIG}, split {split})"
    rows, reason = sources.load_hub_split(GSM8K_HUB_ID, GSM8K_HUB_CONFIG, split)
    if rows is not None:
        sources.require_keys(rows, ("question", "answer"), hub_label)
        return rows, "hub", hub_label
    tried.append(f"{hub_label}: {reason}")
    local, local_reason = sources.local_file(data_dir, relative)
    if local is None:
        tried.append(local_reason)
        return None
    rows = sources.read_local_jsonl(local)
    sources.require_keys(rows, ("question", "answer"), str(local), non_blank_line_numbers(local))
    return rows, "local", str(local)


@dataclass(frozen=True)
class Split:
    """A whole GSM8K split read from the local data directory (the zoo's training text)."""

    records: list[dict]  # {"question": str, "answer": str}
    path: Path
    sha256: str  # of the file's bytes, for the build record


def read_split(data_dir: str | os.PathLike | None, split: str) -> Split:
    """Every record of one local GSM8K split, as plain JSON (no `datasets`, no network: zoo builds
    run offline); each line must hold string ``question`` and ``answer``."""
    if split not in SPLIT_FILES:
        raise ValueError(f"GSM8K split must be one of {sorted(SPLIT_FILES)}, got {split!r}")
    root = sources.data_dir(data_dir)
    if root is None:
        raise FileNotFoundError(
            f"no GSM8K data directory: pass --data-dir or set {sources.DATA_DIR_ENV} to a directory holding "
            f"{GSM8K_TRAIN_FILE} and {GSM8K_TEST_FILE} (the hub dataset {GSM8K_HUB_ID} is not used: "
            "zoo builds run offline)"
        )
    path = root / SPLIT_FILES[split]
    if not path.is_file():
        raise FileNotFoundError(
            f"GSM8K {split} split not found at {path}; put the JSONL file there (fields question, answer; "
            f"it is the {GSM8K_HUB_ID} dataset, config {GSM8K_HUB_CONFIG}, split {split}) or point --data-dir / "
            f"{sources.DATA_DIR_ENV} at the directory that holds it. Zoo builds never download it."
        )
    records = []
    raw = path.read_bytes()  # read once: the records and the build record's hash come from the same bytes
    for _, where, record in iter_json_lines(decode_text(raw, str(path)), str(path)):
        for key in ("question", "answer"):
            if not isinstance(record, dict) or not isinstance(record.get(key), str):
                found = repr(record.get(key))[:60] if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{where}: key {key!r} must be a string, found {found}")
        records.append({"question": record["question"], "answer": record["answer"]})
    if not records:
        raise ValueError(f"{path}: holds no records")
    return Split(records=records, path=path, sha256=hashlib.sha256(raw).hexdigest())
