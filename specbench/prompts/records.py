"""A prompt (text or token ids) and a prompt set with where it came from; the reader of user
JSONL files of ``prompt`` / ``prompt_token_ids`` records."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from specbench.io.jsonl import iter_json_records


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


def read_prompt_records(path: Path, label: str | None = None) -> list[Prompt]:
    """Prompts from a JSON Lines file (or a .json array) of records holding exactly one of
    ``prompt`` (text) or ``prompt_token_ids`` (list of ints), optionally ``id`` and ``category``."""
    label = label or str(path)
    prompts: list[Prompt] = []
    seen_ids: dict[str, int] = {}
    for where, record in iter_json_records(path, label):
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



def _tokenizer_name(tokenizer) -> str:
    return repr(getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__)
