"""Spec-Bench prompts (``question.jsonl``: six subtasks of 80, MT-bench's questions among them),
read from the local data directory; the first turn of each question."""

from __future__ import annotations

from specbench.io.jsonl import non_blank_line_numbers
from specbench.prompts import sources
from specbench.prompts.records import DatasetUnavailable, Prompt, PromptSet

SPEC_BENCH_FILE = "spec_bench/question.jsonl"
# Spec-Bench files its MT-bench questions under MT-bench's own eight categories.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def load_spec_bench(spec: str, data_dir: str | None) -> PromptSet:
    # Spec-Bench has no canonical hub dataset, so only the local file is tried.
    subtask = "mt_bench" if spec == "mt_bench" else spec.partition("/")[2] or None
    local, local_reason = sources.local_file(data_dir, SPEC_BENCH_FILE)
    if local is None:
        raise DatasetUnavailable(sources.unavailable_message(spec, [local_reason], SPEC_BENCH_FILE))
    rows, line_numbers = sources.read_local_jsonl(local), non_blank_line_numbers(local)
    sources.require_keys(rows, ("question_id", "category", "turns"), str(local), line_numbers)
    prompts = []
    for row, line in zip(rows, line_numbers):
        category = "mt_bench" if row["category"] in MT_BENCH_CATEGORIES else row["category"]
        turns = row["turns"]
        if category not in SPEC_BENCH_SUBTASKS:
            raise ValueError(
                f"{local}, line {line}: key 'category' is {row['category']!r}; expected one of "
                f"{', '.join(SPEC_BENCH_SUBTASKS[1:] + MT_BENCH_CATEGORIES)}. Is this Spec-Bench's question.jsonl?"
            )
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{local}, line {line}: key 'turns' must be a non-empty list of strings, found {turns!r}")
        if subtask is None or category == subtask:
            # first turn only: later turns need the model's own answer to the first
            prompts.append(Prompt(id=str(row["question_id"]), category=category, text=turns[0]))
    return PromptSet(spec, "local", prompts, origin=str(local))
