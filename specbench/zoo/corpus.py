"""The zoo's training text formats over GSM8K splits (read by :func:`specbench.prompts.gsm8k.read_split`).

The prompt format is the zero-shot one of :func:`specbench.prompts.format_gsm8k_prompt` with no
exemplars, so prompts at evaluation time are exact prefixes of the training documents.
"""

from __future__ import annotations

from specbench.prompts.gsm8k import format_gsm8k_prompt


def prompt_text(question: str) -> str:
    """The zero-shot GSM8K prompt, ``Question: <q>\\nAnswer:``: the prompt sets' own format, no shots."""
    return format_gsm8k_prompt(question, [])


def document_text(record: dict) -> str:
    """One training document, ``Question: <q>\\nAnswer: <a>``; the tokenizer appends EOS after it."""
    return f"{prompt_text(record['question'])} {record['answer']}"


def prompt_ids(tokenizer, questions: list[str]) -> list[list[int]]:
    """The zero-shot prompts of ``questions`` as token ids (no special tokens: prefixes of the training documents)."""
    return tokenizer([prompt_text(q) for q in questions], add_special_tokens=False)["input_ids"]


def partition_records(records: list[dict], num_heldout: int, num_distill_only: int) -> tuple[list, list, list]:
    """(train, distill, held-out) records: the target trains on the first; the second (the records just before
    the held-out ones, else the training ones) prompts the self-distillation; the last ``num_heldout`` are held out."""
    cut = len(records) - num_heldout - num_distill_only
    # questions the target never trains on: continuations of them look like test-time ones
    return records[:cut], records[cut:-num_heldout] or records[:cut], records[-num_heldout:]
