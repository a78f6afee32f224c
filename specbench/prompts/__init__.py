"""Every prompt source in one package: GSM8K n-shot, Spec-Bench and MT-bench, user JSONL files, the
embedded set and synthetic token ids; hub first through `datasets`, then ``$SPECBENCH_DATA_DIR``."""

from specbench.prompts.gsm8k import format_gsm8k_prompt
from specbench.prompts.load import known_prompt_sets, load_prompts
from specbench.prompts.records import DatasetUnavailable, Prompt, PromptSet
from specbench.prompts.synthetic import synthetic_prompts
from specbench.references import DATA_DIR_ENV

__all__ = [
    "DATA_DIR_ENV",
    "DatasetUnavailable",
    "Prompt",
    "PromptSet",
    "format_gsm8k_prompt",
    "known_prompt_sets",
    "load_prompts",
    "synthetic_prompts",
]
