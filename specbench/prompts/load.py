"""``load_prompts``: a prompt set by name (GSM8K n-shot, Spec-Bench and its subtasks, MT-bench, the
embedded set) or from a user's JSONL file; hub first for hub-backed sets, then ``$SPECBENCH_DATA_DIR``."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path

from specbench.prompts.gsm8k import load_gsm8k
from specbench.prompts.records import DatasetUnavailable, PromptSet, read_prompt_records
from specbench.prompts.spec_bench import SPEC_BENCH_SUBTASKS, load_spec_bench

# Embedded sets shipped inside the package: name -> file under specbench/prompts/data/ holding
# `prompt` / `prompt_token_ids` records. "gsm8k-embedded": original GSM8K-style questions, zero-shot,
# for runs with no hub and no data directory (records also keep `question` and worked `answer`).
EMBEDDED_SETS: dict[str, str] = {"gsm8k-embedded": "gsm8k_style.jsonl"}
EMBEDDED_PACKAGE_DIR = "prompts/data"


def known_prompt_sets() -> list[str]:
    """Names accepted by :func:`load_prompts` besides JSONL paths."""
    names = ["gsm8k", "spec_bench", "mt_bench", *(f"spec_bench/{t}" for t in SPEC_BENCH_SUBTASKS)]
    return names + sorted(EMBEDDED_SETS)


def load_prompts(
    spec: str,
    *,
    num_prompts: int | None = None,
    n_shot: int = 1,
    tokenizer=None,
    chat_template: bool = False,
    data_dir: str | None = None,
) -> PromptSet:
    """Load the prompt set ``spec`` (a known name or a path to a .jsonl/.json file); keep the
    first ``num_prompts`` in file order. ``n_shot`` applies to GSM8K only. With a tokenizer,
    every prompt's ``token_ids`` is filled in. ``data_dir`` overrides ``$SPECBENCH_DATA_DIR``."""
    if not isinstance(n_shot, int) or isinstance(n_shot, bool) or n_shot < 0:
        raise ValueError(f"n_shot must be an integer >= 0, got {n_shot!r}")
    if num_prompts is not None and (not isinstance(num_prompts, int) or isinstance(num_prompts, bool) or num_prompts < 1):
        raise ValueError(f"num_prompts must be a positive integer or None, got {num_prompts!r}")
    if chat_template and tokenizer is None:
        raise ValueError("chat_template=True needs a tokenizer; pass tokenizer=")
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"prompt set must be a non-empty string, got {spec!r}")

    if spec == "gsm8k":
        prompt_set = load_gsm8k(n_shot, num_prompts, data_dir)
    elif spec in ("spec_bench", "mt_bench") or spec in {f"spec_bench/{t}" for t in SPEC_BENCH_SUBTASKS}:
        prompt_set = load_spec_bench(spec, data_dir)
    elif spec in EMBEDDED_SETS:
        prompt_set = _load_embedded(spec)
    elif spec.lower().endswith((".jsonl", ".json")):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {spec!r} does not exist or is not a regular file")
        prompt_set = PromptSet(str(path), "file", read_prompt_records(path), origin=str(path.resolve()))
    else:
        raise ValueError(
            f"unknown prompt set {spec!r}; known: {', '.join(known_prompt_sets())}, "
            "or a path to a .jsonl/.json file of `prompt` or `prompt_token_ids` records"
        )

    prompts = prompt_set.prompts
    if num_prompts is not None:
        if num_prompts > len(prompts):
            raise ValueError(
                f"num_prompts={num_prompts} but prompt set {spec!r} ({prompt_set.origin}) holds only "
                f"{len(prompts)}; ask for at most {len(prompts)}"
            )
        prompts = prompts[:num_prompts]
    if tokenizer is not None:
        prompts = [replace(p, token_ids=p.to_token_ids(tokenizer, chat_template=chat_template)) for p in prompts]
    return replace(prompt_set, prompts=prompts)


def _embedded_root():
    return resources.files("specbench.prompts").joinpath("data")


def _load_embedded(name: str) -> PromptSet:
    resource = _embedded_root().joinpath(EMBEDDED_SETS[name])
    with resources.as_file(resource) as path:
        if not path.is_file():
            raise DatasetUnavailable(
                f"embedded prompt set {name!r}: {path} is missing from the installed package; reinstall specbench"
            )
        label = f"specbench/{EMBEDDED_PACKAGE_DIR}/{EMBEDDED_SETS[name]}"
        return PromptSet(name, "embedded", read_prompt_records(path, label), origin=label)
