"""Prompt sets for benchmark runs (FIELD_NOTES §5): GSM8K n-shot, Spec-Bench and its subtasks,
MT-bench, and user JSONL files; hub first for hub-backed sets, then ``$SPECBENCH_DATA_DIR``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from specbench.prompts import sources
from specbench.prompts.sources import DATA_DIR_ENV  # noqa: F401  (public: the variable's name)

GSM8K_HUB_ID, GSM8K_HUB_CONFIG = "openai/gsm8k", "main"
# Fixed relative paths under the data directory; names are never joined into paths.
GSM8K_TEST_FILE, GSM8K_TRAIN_FILE = "gsm8k/test.jsonl", "gsm8k/train.jsonl"
SPEC_BENCH_FILE = "spec_bench/question.jsonl"
# Spec-Bench files its MT-bench questions under MT-bench's own eight categories.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# Embedded sets shipped inside the package: name -> file under specbench/prompt_data/ holding
# `prompt` / `prompt_token_ids` records. "gsm8k-embedded": original GSM8K-style questions, zero-shot,
# for runs with no hub and no data directory (records also keep `question` and worked `answer`).
EMBEDDED_SETS: dict[str, str] = {"gsm8k-embedded": "gsm8k_style.jsonl"}
EMBEDDED_PACKAGE_DIR = "prompt_data"

# Used only when no GSM8K train split is reachable: it is train record 0 (openai/grade-school-math,
# MIT), so a 1-shot prompt is the same text whether or not the train split was found.
FALLBACK_GSM8K_EXEMPLAR = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
    "altogether in April and May.\n#### 72",
}


class DatasetUnavailable(RuntimeError):
    """A known prompt set could be found neither on the hub nor in the local data directory."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: text (tokenised later) or token ids given as such, never both missing."""

    id: str
    category: str | None
    text: str | None
    token_ids: list[int] | None = None  # as given by the file, or as tokenised by load_prompts

    def to_token_ids(self, tokenizer=None, *, chat_template: bool = False) -> list[int]:
        """Token ids of this prompt; a text prompt is tokenised with ``tokenizer`` (its chat
        template wrapped around the text as one user turn when ``chat_template``)."""
        if self.text is None:
            if chat_template:
                raise ValueError(
                    f"prompt {self.id!r} is given as token ids; a chat template applies to text only. "
                    "Pass chat_template=False or give the prompt as text (`prompt`)."
                )
            if tokenizer is not None and self.token_ids and max(self.token_ids) >= len(tokenizer):
                raise ValueError(
                    f"prompt {self.id!r} holds token id {max(self.token_ids)}, outside the vocabulary of "
                    f"{_tokenizer_name(tokenizer)} ({len(tokenizer)} tokens); use the tokenizer the ids came from"
                )
            return list(self.token_ids)
        if tokenizer is None:
            raise ValueError(f"prompt {self.id!r} is text; pass a tokenizer to get token ids")
        if not chat_template:
            return list(tokenizer(self.text)["input_ids"])
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {_tokenizer_name(tokenizer)} has no chat template (tokenizer.chat_template is "
                "unset); pass chat_template=False or a chat model's tokenizer"
            )
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": self.text}], tokenize=False, add_generation_prompt=True
        )
        # the template already holds the special tokens (BOS etc.); adding them again doubles them
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class PromptSet:
    """An ordered prompt set and where it came from."""

    name: str
    source: str  # "hub" | "local" | "file" | "embedded"
    prompts: list[Prompt]
    origin: str  # hub id and split, or the file read
    n_shot: int | None = None  # GSM8K only
    notes: tuple[str, ...] = field(default=())  # fallbacks taken on the way, for the run record

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self) -> Iterator[Prompt]:
        return iter(self.prompts)


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
        prompt_set = _load_gsm8k(n_shot, num_prompts, data_dir)
    elif spec in ("spec_bench", "mt_bench") or spec in {f"spec_bench/{t}" for t in SPEC_BENCH_SUBTASKS}:
        prompt_set = _load_spec_bench(spec, data_dir)
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


# ---- GSM8K ----------------------------------------------------------------------------------

def format_gsm8k_prompt(question: str, exemplars: list[dict]) -> str:
    """Worked examples as ``Question: ...\\nAnswer: ...\\n\\n``, then ``Question: <q>\\nAnswer:``."""
    shots = "".join(f"Question: {ex['question']}\nAnswer: {ex['answer']}\n\n" for ex in exemplars)
    return f"{shots}Question: {question}\nAnswer:"


def _load_gsm8k(n_shot: int, num_prompts: int | None, data_dir: str | None) -> PromptSet:
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
    sources.require_keys(rows, ("question", "answer"), str(local), sources.non_blank_line_numbers(local))
    return rows, "local", str(local)


# ---- Spec-Bench -----------------------------------------------------------------------------

def _load_spec_bench(spec: str, data_dir: str | None) -> PromptSet:
    # Spec-Bench has no canonical hub dataset, so only the local file is tried.
    subtask = "mt_bench" if spec == "mt_bench" else spec.partition("/")[2] or None
    local, local_reason = sources.local_file(data_dir, SPEC_BENCH_FILE)
    if local is None:
        raise DatasetUnavailable(sources.unavailable_message(spec, [local_reason], SPEC_BENCH_FILE))
    rows, line_numbers = sources.read_local_jsonl(local), sources.non_blank_line_numbers(local)
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


# ---- JSONL files and embedded sets ----------------------------------------------------------

def read_prompt_records(path: Path, label: str | None = None) -> list[Prompt]:
    """Prompts from a JSON Lines file (or a .json array) of records holding exactly one of
    ``prompt`` (text) or ``prompt_token_ids`` (list of ints), optionally ``id`` and ``category``."""
    label = label or str(path)
    prompts: list[Prompt] = []
    seen_ids: dict[str, int] = {}
    for where, record in sources.iter_json_records(path, label):
        has_text, has_ids = "prompt" in record, "prompt_token_ids" in record
        if has_text == has_ids:
            found = "both" if has_text else f"neither (keys: {', '.join(sorted(record)) or 'none'})"
            raise ValueError(f"{where}: expected exactly one of keys 'prompt' or 'prompt_token_ids', found {found}")
        text, token_ids = record.get("prompt"), record.get("prompt_token_ids")
        if has_text and (not isinstance(text, str) or not text):
            raise ValueError(f"{where}: key 'prompt' must be a non-empty string, found {text!r:.80}")
        if has_ids and (
            not isinstance(token_ids, list)
            or not token_ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in token_ids)
        ):
            raise ValueError(
                f"{where}: key 'prompt_token_ids' must be a non-empty list of integers >= 0, found {token_ids!r:.80}"
            )
        prompt_id = record.get("id", str(len(prompts)))
        if not isinstance(prompt_id, (str, int)) or isinstance(prompt_id, bool):
            raise ValueError(f"{where}: key 'id' must be a string or an integer, found {prompt_id!r}")
        category = record.get("category")
        if category is not None and not isinstance(category, str):
            raise ValueError(f"{where}: key 'category' must be a string, found {category!r}")
        if str(prompt_id) in seen_ids:
            first = seen_ids[str(prompt_id)]
            raise ValueError(f"{where}: key 'id' repeats {prompt_id!r} (first used by prompt {first} of this file)")
        seen_ids[str(prompt_id)] = len(prompts)
        prompts.append(Prompt(id=str(prompt_id), category=category, text=text, token_ids=token_ids))
    if not prompts:
        raise ValueError(f"{label}: holds no records")
    return prompts


def _embedded_root():
    return resources.files("specbench").joinpath(EMBEDDED_PACKAGE_DIR)


def _load_embedded(name: str) -> PromptSet:
    resource = _embedded_root().joinpath(EMBEDDED_SETS[name])
    with resources.as_file(resource) as path:
        if not path.is_file():
            raise DatasetUnavailable(
                f"embedded prompt set {name!r}: {path} is missing from the installed package; reinstall specbench"
            )
        label = f"specbench/{EMBEDDED_PACKAGE_DIR}/{EMBEDDED_SETS[name]}"
        return PromptSet(name, "embedded", read_prompt_records(path, label), origin=label)


def _tokenizer_name(tokenizer) -> str:
    return repr(getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__)
