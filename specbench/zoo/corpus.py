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
