"""Prompt sets: counts and formats against the shared data files, JSONL files, every error path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

from specbench.prompts import DatasetUnavailable, Prompt, gsm8k, known_prompt_sets, load, load_prompts, sources, spec_bench


def _shared_data_dir() -> tuple[Path | None, str]:
    root = os.environ.get("SPECBENCH_DATA_DIR")
    if not root:
        return None, "SPECBENCH_DATA_DIR is unset; set it to the shared data directory (e.g. /work/shared/data)"
    for relative in ("gsm8k/test.jsonl", "gsm8k/train.jsonl", "spec_bench/question.jsonl"):
        if not (Path(root) / relative).is_file():
            return None, f"SPECBENCH_DATA_DIR={root} lacks {relative}"
    return Path(root), ""


DATA_DIR, DATA_SKIP_REASON = _shared_data_dir()
needs_data = pytest.mark.skipif(DATA_DIR is None, reason=DATA_SKIP_REASON)


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch, tmp_path):
    # the hub path must fail fast and never read a real cache, so the local files are what is tested
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def _jsonl_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def _char_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, BOS prepended: ids are predictable by hand."""
    vocab = {"<unk>": 0, "<s>": 1, "\n": 2}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>")
    tokenizer.chat_template = chat_template
    return tokenizer


def _char_ids(text: str) -> list[int]:
    return [2 if ch == "\n" else ord(ch) - 32 + 3 for ch in text]


# ---- the shared data files ------------------------------------------------------------------

@needs_data
def test_gsm8k_counts_and_one_shot_format():
    full = load_prompts("gsm8k", data_dir=str(DATA_DIR))
    assert (full.source, full.n_shot, len(full)) == ("local", 1, 1319)  # SOURCES.md: 1,319 test items
    assert any("OfflineModeIsEnabled" in n or "HF_HUB_OFFLINE" in n for n in full.notes)

    test = _jsonl_rows(DATA_DIR / "gsm8k/test.jsonl")
    train0 = _jsonl_rows(DATA_DIR / "gsm8k/train.jsonl")[0]
    expected = f"Question: {train0['question']}\nAnswer: {train0['answer']}\n\nQuestion: {test[5]['question']}\nAnswer:"
    assert full.prompts[5].text == expected
    assert [p.id for p in full.prompts[:3]] == ["0", "1", "2"]


@needs_data
def test_gsm8k_n_shot_uses_train_records_in_order(monkeypatch):
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(DATA_DIR))  # the variable alone must suffice
    train = _jsonl_rows(DATA_DIR / "gsm8k/train.jsonl")
    question0 = _jsonl_rows(DATA_DIR / "gsm8k/test.jsonl")[0]["question"]
    three = load_prompts("gsm8k", num_prompts=2, n_shot=3)
    shots = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in train[:3])
    assert (len(three), three.n_shot) == (2, 3)
    assert three.prompts[0].text == f"{shots}Question: {question0}\nAnswer:"
    zero = load_prompts("gsm8k", num_prompts=1, n_shot=0)
    assert zero.prompts[0].text == f"Question: {question0}\nAnswer:"


@needs_data
def test_fallback_exemplar_is_train_record_zero():
    # the built-in exemplar must give the very prompt the train split gives, or 1-shot results
    # would depend on whether the train file was found
    train0 = _jsonl_rows(DATA_DIR / "gsm8k/train.jsonl")[0]
    assert gsm8k.FALLBACK_GSM8K_EXEMPLAR == {"question": train0["question"], "answer": train0["answer"]}


@needs_data
def test_spec_bench_counts_and_subtasks():
    everything = load_prompts("spec_bench", data_dir=str(DATA_DIR))
    assert len(everything) == 480  # SOURCES.md: 480 questions, six subtasks of 80
    rows = _jsonl_rows(DATA_DIR / "spec_bench/question.jsonl")
    assert [p.text for p in everything] == [r["turns"][0] for r in rows]  # first turn, file order
    for subtask in spec_bench.SPEC_BENCH_SUBTASKS:
        subset = load_prompts(f"spec_bench/{subtask}", data_dir=str(DATA_DIR))
        assert len(subset) == 80 and {p.category for p in subset} == {subtask}
    mt_bench = load_prompts("mt_bench", data_dir=str(DATA_DIR), num_prompts=5)
    assert [p.id for p in mt_bench] == [str(r["question_id"]) for r in rows[:5]]
    assert mt_bench.prompts == load_prompts("spec_bench/mt_bench", data_dir=str(DATA_DIR)).prompts[:5]


@needs_data
def test_num_prompts_takes_the_first_in_file_order_and_rejects_too_many():
    qa = load_prompts("spec_bench/qa", data_dir=str(DATA_DIR), num_prompts=4)
    assert qa.prompts == load_prompts("spec_bench/qa", data_dir=str(DATA_DIR)).prompts[:4]
    with pytest.raises(ValueError, match=r"num_prompts=81 .* holds only 80"):
        load_prompts("spec_bench/qa", data_dir=str(DATA_DIR), num_prompts=81)


# ---- hub fallbacks and unavailability -------------------------------------------------------

def test_gsm8k_unavailable_names_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECBENCH_DATA_DIR", raising=False)
    with pytest.raises(DatasetUnavailable) as unset:
        load_prompts("gsm8k")
    assert "openai/gsm8k" in str(unset.value) and "SPECBENCH_DATA_DIR is not set" in str(unset.value)
    assert "SPECBENCH_DATA_DIR=/path/to/data" in str(unset.value)

    with pytest.raises(DatasetUnavailable) as missing:
        load_prompts("gsm8k", data_dir=str(tmp_path))
    assert str(tmp_path / "gsm8k/test.jsonl") in str(missing.value)
    assert "SPECBENCH_DATA_DIR=/path/to/data" in str(missing.value)


def test_spec_bench_unavailable_names_the_file_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(tmp_path))
    with pytest.raises(DatasetUnavailable, match="SPECBENCH_DATA_DIR=/path/to/data") as err:
        load_prompts("spec_bench/rag")
    assert str(tmp_path / "spec_bench/question.jsonl") in str(err.value)


def test_unreachable_hub_without_offline_flag_falls_back_fast(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    # .invalid never resolves (RFC 2606), so the probe answers at once
    monkeypatch.setenv("HF_ENDPOINT", "https://specbench-test.invalid")
    (tmp_path / "gsm8k").mkdir()
    _write_jsonl(tmp_path / "gsm8k/test.jsonl", [{"question": "What is 2+2?", "answer": "#### 4"}])
    loaded = load_prompts("gsm8k", data_dir=str(tmp_path))
    assert loaded.source == "local" and any("hub unreachable" in n for n in loaded.notes)


def test_missing_train_split_uses_the_fixed_exemplar_and_says_so(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    _write_jsonl(tmp_path / "gsm8k/test.jsonl", [{"question": "What is 2+2?", "answer": "#### 4"}])
    one = load_prompts("gsm8k", data_dir=str(tmp_path))
    ex = gsm8k.FALLBACK_GSM8K_EXEMPLAR
    assert one.prompts[0].text == f"Question: {ex['question']}\nAnswer: {ex['answer']}\n\nQuestion: What is 2+2?\nAnswer:"
    assert any("built-in exemplar" in n for n in one.notes)
    with pytest.raises(DatasetUnavailable, match=r"2-shot exemplars.*gsm8k/train\.jsonl not found"):
        load_prompts("gsm8k", data_dir=str(tmp_path), n_shot=2)


def test_bad_record_in_a_known_file_names_file_line_and_key(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    path = _write_jsonl(tmp_path / "gsm8k/test.jsonl", [{"question": "q1", "answer": "a"}, "", {"question": "q2"}])
    with pytest.raises(ValueError, match=rf"{path}, line 3: key 'answer' is missing"):
        load_prompts("gsm8k", data_dir=str(tmp_path), n_shot=0)


# ---- names and JSONL files ------------------------------------------------------------------

def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        load_prompts("../gsm8k")  # names are looked up, never joined into a path
    for name in known_prompt_sets():
        assert name in str(err.value)
    assert {"gsm8k", "spec_bench", "mt_bench", "spec_bench/math_reasoning"} <= set(known_prompt_sets())


def test_jsonl_with_text_and_with_token_ids(tmp_path):
    text_file = _write_jsonl(tmp_path / "text.jsonl", [{"prompt": "Hi"}, {"prompt": "yo", "id": "b", "category": "c"}])
    texts = load_prompts(str(text_file))
    assert texts.source == "file"
    assert texts.prompts == [Prompt("0", None, "Hi"), Prompt("b", "c", "yo")]

    ids_records = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8]}, {"prompt_token_ids": [9]}]
    ids_file = _write_jsonl(tmp_path / "ids.jsonl", ids_records)
    ids = load_prompts(str(ids_file), num_prompts=2)
    assert [p.token_ids for p in ids] == [[5, 6, 7], [8]] and ids.prompts[0].text is None
    assert ids.prompts[0].to_token_ids() == [5, 6, 7]

    array_file = tmp_path / "array.json"
    array_file.write_text(json.dumps([{"prompt": "x"}]), encoding="utf-8")
    assert load_prompts(str(array_file)).prompts == [Prompt("0", None, "x")]


def test_missing_or_irregular_prompt_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(FileNotFoundError, match="not a regular file"):
        load_prompts(str(tmp_path / "dir.jsonl"))
    with pytest.raises(ValueError, match="unknown prompt set"):
        load_prompts(str(tmp_path / "prompts.txt"))


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"text": "hi"}', "exactly one of keys 'prompt' or 'prompt_token_ids', found neither"),
        ('{"prompt": "a", "prompt_token_ids": [1]}', "found both"),
        ('{"prompt": 3}', "key 'prompt' must be a non-empty string, found 3"),
        ('{"prompt_token_ids": [1, "2"]}', "key 'prompt_token_ids' must be a non-empty list of integers"),
        ('{"prompt_token_ids": [1, true]}', "key 'prompt_token_ids' must be a non-empty list of integers"),
        ('{"prompt": "b", "id": "0"}', "key 'id' repeats '0'"),
        ('{"prompt": "a"', "invalid JSON"),
        ('["a"]', "expected a JSON object"),
    ],
)
def test_bad_record_names_file_line_and_key(tmp_path, bad_line, message):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}, "", bad_line])
    with pytest.raises(ValueError) as err:
        load_prompts(str(path))
    assert f"{path}, line 3" in str(err.value) and message in str(err.value)


def test_argument_checks(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}])
    with pytest.raises(ValueError, match="num_prompts must be a positive integer"):
        load_prompts(str(path), num_prompts=0)
    with pytest.raises(ValueError, match="n_shot must be an integer >= 0"):
        load_prompts(str(path), n_shot=-1)
    with pytest.raises(ValueError, match="chat_template=True needs a tokenizer"):
        load_prompts(str(path), chat_template=True)


# ---- tokenisation ---------------------------------------------------------------------------

def test_tokenizer_fills_token_ids_with_and_without_chat_template(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi"}])
    plain = load_prompts(str(path), tokenizer=_char_tokenizer())
    assert plain.prompts[0].token_ids == [1, *_char_ids("Hi")]  # BOS from the tokenizer's post-processor

    template = "{% for m in messages %}<s>[{{ m.role }}]{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[bot]{% endif %}"
    chat = load_prompts(str(path), tokenizer=_char_tokenizer(template), chat_template=True)
    # the template writes <s> itself; a second BOS from add_special_tokens would double it
    assert chat.prompts[0].token_ids == [1, *_char_ids("[user]Hi\n[bot]")]


def test_chat_template_errors(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi"}])
    with pytest.raises(ValueError, match="has no chat template"):
        load_prompts(str(path), tokenizer=_char_tokenizer(), chat_template=True)
    ids = _write_jsonl(tmp_path / "ids.jsonl", [{"prompt_token_ids": [3, 4]}])
    with pytest.raises(ValueError, match="given as token ids; a chat template applies to text only"):
        load_prompts(str(ids), tokenizer=_char_tokenizer("{{ messages }}"), chat_template=True)
    out_of_vocab = _write_jsonl(tmp_path / "oov.jsonl", [{"prompt_token_ids": [3, 5000]}])
    with pytest.raises(ValueError, match="token id 5000, outside the vocabulary"):
        load_prompts(str(out_of_vocab), tokenizer=_char_tokenizer())
    with pytest.raises(ValueError, match="pass a tokenizer"):
        Prompt("x", None, "text").to_token_ids()


# ---- embedded sets (extension point) --------------------------------------------------------

def test_embedded_set_is_read_from_the_package_resource(tmp_path, monkeypatch):
    _write_jsonl(tmp_path / "tiny.jsonl", [{"prompt": "embedded one"}])
    monkeypatch.setitem(load.EMBEDDED_SETS, "tiny-embedded", "tiny.jsonl")
    monkeypatch.setattr(load, "_embedded_root", lambda: tmp_path)
    loaded = load_prompts("tiny-embedded")
    assert (loaded.source, [p.text for p in loaded]) == ("embedded", ["embedded one"])
    assert "tiny-embedded" in known_prompt_sets()


def test_hub_is_tried_first_and_its_train_split_gives_the_exemplars(tmp_path, monkeypatch):
    hub = {
        "test": [{"question": "hub q", "answer": "#### 1"}],
        "train": [{"question": "hub train q", "answer": "hub train a"}],
    }
    asked = []

    def fake_hub(hub_id, config, split):
        asked.append((hub_id, config, split))
        return hub[split], ""

    monkeypatch.setattr(sources, "load_hub_split", fake_hub)
    (tmp_path / "gsm8k").mkdir()
    _write_jsonl(tmp_path / "gsm8k/test.jsonl", [{"question": "local q", "answer": "#### 2"}])
    loaded = load_prompts("gsm8k", data_dir=str(tmp_path))
    assert asked == [("openai/gsm8k", "main", "test"), ("openai/gsm8k", "main", "train")]
    assert (loaded.source, loaded.notes) == ("hub", ())
    assert loaded.prompts[0].text == "Question: hub train q\nAnswer: hub train a\n\nQuestion: hub q\nAnswer:"


@needs_data
def test_local_files_load_without_the_datasets_package(monkeypatch):
    """The lent GPU machine has no `datasets`: local copies must still load, with identical prompts."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with_datasets = load_prompts("gsm8k", num_prompts=5, data_dir=str(DATA_DIR))
    monkeypatch.setattr(sources, "datasets", None)
    without = load_prompts("gsm8k", num_prompts=5, data_dir=str(DATA_DIR))
    assert without.source == "local"
    assert [p.text for p in without] == [p.text for p in with_datasets]
