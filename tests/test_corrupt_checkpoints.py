"""Damaged checkpoints fail with one CheckpointError line naming the file, what is wrong and what to do:
truncated, empty or foreign target weights, broken configs, missing shards or weights, NaN/inf
weights (target and Medusa heads), and pickles beyond tensors (never advising weights_only=False)."""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
import traceback
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaForCausalLM

from specbench.checkpoints.resolve import load_target_model
from specbench.checkpoints.tensor_files import CheckpointError
from specbench.checkpoints.tiny import tiny_llama, tiny_llama_config
from specbench.medusa.checkpoint import load_medusa_heads, save_medusa_heads
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig
from specbench.references import ReferenceMissing, resolve_reference

REPO = Path(__file__).resolve().parent.parent
HIDDEN, VOCAB = 16, 32
# torch's advice on how to load a refused pickle anyway; none of it may reach a specbench message
TORCH_ADVICE = ("weights_only=False", "`weights_only` set to `False`", "Re-running", "add_safe_globals", "allowlist", "trust the source")


class _Payload:
    """An arbitrary class instance: torch.load(weights_only=True) must refuse to unpickle it."""


class _RunsCode:
    """Unpickling this would call os.makedirs(marker): the shape of a code-execution payload."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker,)


def _error(call) -> str:
    with pytest.raises(CheckpointError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    return message


def _load(directory, dtype=torch.float32):
    return lambda: load_target_model(directory, dtype=dtype, device="cpu")


# ---------------------------------------------------------------- target weights files


@pytest.fixture
def zoo_target(tmp_path) -> Path:
    """A private copy of the reference target (Llama, one model.safetensors of 13.7 MB)."""
    try:
        source = resolve_reference("specbench-ref/gsm8k-tiny")
    except ReferenceMissing as e:
        pytest.skip(str(e))
    return Path(shutil.copytree(source, tmp_path / "target"))


def _header_and_data_bytes(path: Path) -> tuple[int, int]:
    with path.open("rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
    return header_len, path.stat().st_size - 8 - header_len


def test_truncated_target_weights_say_how_many_bytes_are_missing(zoo_target):
    weights = zoo_target / "model.safetensors"
    header_len, data_bytes = _header_and_data_bytes(weights)
    half = weights.stat().st_size // 2
    with weights.open("r+b") as f:
        f.truncate(half)
    message = _error(_load(zoo_target))
    assert message == (
        f"{weights}: truncated: header says {data_bytes} bytes of data but the file holds {half - 8 - header_len}; "
        "re-download it, re-export it, or check the copy"
    )


def test_target_weights_cut_inside_the_header(zoo_target):
    weights = zoo_target / "model.safetensors"
    header_len, _ = _header_and_data_bytes(weights)
    weights.write_bytes(weights.read_bytes()[:100])
    message = _error(_load(zoo_target))
    assert message.startswith(f"{weights}: truncated: the header length field says {header_len} bytes of header but the file holds only 92 bytes after it")


def test_random_bytes_are_not_a_safetensors_file(zoo_target):
    weights = zoo_target / "model.safetensors"
    weights.write_bytes(random.Random(0).randbytes(64))
    message = _error(_load(zoo_target))
    assert message.startswith(f"{weights}: not a safetensors file: its first 8 bytes give a header length of ")
    assert "and the file holds 64 bytes in all; re-download it, re-export it, or check the copy" in message


def test_empty_target_weights(zoo_target):
    weights = zoo_target / "model.safetensors"
    weights.write_bytes(b"")
    assert _error(_load(zoo_target)) == (
        f"{weights}: empty file (0 bytes), expected a safetensors file; the download or copy did not complete: "
        "re-download it, re-export it, or check the copy"
    )


def test_git_lfs_pointer_instead_of_weights(zoo_target):
    weights = zoo_target / "model.safetensors"
    weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 13713744\n")
    message = _error(_load(zoo_target))
    assert message.startswith(f"{weights}: not a safetensors file")
    assert "it is a Git LFS pointer: the weights were never fetched; run `git lfs pull`" in message


def test_trailing_bytes_after_the_data(zoo_target):
    weights = zoo_target / "model.safetensors"
    _, data_bytes = _header_and_data_bytes(weights)
    with weights.open("ab") as f:
        f.write(b"\0" * 10)
    assert f"{weights}: corrupt: header says {data_bytes} bytes of data but the file holds {data_bytes + 10} (10 unaccounted bytes at the end)" in _error(
        _load(zoo_target)
    )


@pytest.fixture
def tiny_dir(tmp_path) -> Path:
    tiny_llama(seed=3, vocab_size=64, hidden_size=32, num_layers=1).save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def _reshard(directory: Path) -> list[Path]:
    """Split model.safetensors into two shards and an index, as save_pretrained does for big models."""
    with safe_open(directory / "model.safetensors", framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    (directory / "model.safetensors").unlink()
    keys = sorted(tensors)
    shards = [directory / "model-00001-of-00002.safetensors", directory / "model-00002-of-00002.safetensors"]
    for shard, shard_keys in zip(shards, (keys[::2], keys[1::2])):
        save_file({key: tensors[key] for key in shard_keys}, shard, metadata={"format": "pt"})
    weight_map = {key: shards[i % 2].name for i, key in enumerate(keys)}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return shards


def test_sharded_target_loads_and_each_shard_is_checked(tiny_dir):
    shards = _reshard(tiny_dir)
    assert not load_target_model(tiny_dir, dtype=torch.float32, device="cpu").training
    shards[1].write_bytes(shards[1].read_bytes()[:-4])
    assert _error(_load(tiny_dir)).startswith(f"{shards[1]}: truncated: header says ")
    shards[1].unlink()
    assert _error(_load(tiny_dir)) == (
        f"{tiny_dir / 'model.safetensors.index.json'}: lists shard {shards[1].name}, which is missing from {tiny_dir}; "
        "re-download the model, re-export it with save_pretrained, or check the copy"
    )


def test_weights_missing_from_the_files_are_refused_not_randomly_initialised(tiny_dir):
    with safe_open(tiny_dir / "model.safetensors", framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys() if key != "model.norm.weight"}
    save_file(tensors, tiny_dir / "model.safetensors", metadata={"format": "pt"})
    assert _error(_load(tiny_dir)).startswith(
        f"{tiny_dir}: 1 weight(s) the model needs are not in its weights files, first 'model.norm.weight'; "
    )


def test_tied_lm_head_is_not_a_missing_weight(tmp_path):
    # a tied lm_head is saved only as model.embed_tokens.weight; the missing-weights check must allow it
    config = tiny_llama_config(vocab_size=64, hidden_size=32, num_layers=1)
    config.tie_word_embeddings = True
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tied")
    loaded = load_target_model(tmp_path / "tied", dtype=torch.float32, device="cpu")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight


def test_no_weights_file(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()
    assert _error(_load(tiny_dir)).startswith(f"{tiny_dir}: no weights file; looked for model.safetensors, model.safetensors.index.json, ")


# ---------------------------------------------------------------- target config.json


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        ("", "not valid JSON (Expecting value: line 1 column 1 (char 0))"),
        ("[1, 2]", "expected a JSON object, found list"),
        ("\udcff", "not valid JSON ("),
    ],
)
def test_broken_target_config(tiny_dir, content, expected):
    config = tiny_dir / "config.json"
    config.write_bytes(content.encode("utf-8", "surrogateescape"))
    message = _error(_load(tiny_dir))
    assert message.startswith(f"{config}: {expected}")
    assert message.endswith("re-download the model, re-export it with save_pretrained, or check the copy")


def test_missing_target_config(tiny_dir):
    (tiny_dir / "config.json").unlink()
    assert _error(_load(tiny_dir)).startswith(f"{tiny_dir}: no config.json; ")


def test_what_transformers_still_refuses_becomes_one_line_naming_the_directory(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text()) | {"model_type": "no-such-architecture"}
    (tiny_dir / "config.json").write_text(json.dumps(config))
    message = _error(_load(tiny_dir))
    assert message.startswith(f"{tiny_dir}: transformers could not load the model (ValueError: ")
    assert "no-such-architecture" in message


# ---------------------------------------------------------------- non-finite weights


def _poison_target(directory: Path, key: str, values: list[float]) -> None:
    with safe_open(directory / "model.safetensors", framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    flat = tensors[key].view(-1)
    flat[: len(values)] = torch.tensor(values)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def test_nan_target_weights_are_refused_naming_the_parameter(tiny_dir):
    _poison_target(tiny_dir, "model.layers.0.mlp.up_proj.weight", [float("nan"), float("inf"), -float("inf")])
    assert _error(_load(tiny_dir)) == (
        f"{tiny_dir}: parameter 'model.layers.0.mlp.up_proj.weight' holds 3 non-finite value(s) (NaN or inf) of 2048 "
        "(torch.float32); the weights are corrupt or the model diverged: re-download or re-export it"
    )


def test_float16_overflow_of_target_weights_is_refused_with_a_dtype_hint(tiny_dir):
    _poison_target(tiny_dir, "model.norm.weight", [1e6])
    assert load_target_model(tiny_dir, dtype=torch.float32, device="cpu") is not None  # finite in its own dtype
    message = _error(_load(tiny_dir, dtype=torch.float16))
    assert message.startswith(f"{tiny_dir}: parameter 'model.norm.weight' holds 1 non-finite value(s) (NaN or inf) of 32 (torch.float16)")
    assert message.endswith(
        "in torch.float16 values beyond 65504 become inf: load it in bfloat16 or float32; if it still fails, "
        "the weights are corrupt or the model diverged: re-download or re-export it"
    )


def _heads_dir(tmp_path, weights_format="safetensors", poison=None, scale=1.0) -> Path:
    heads = MedusaHeads(MedusaHeadsConfig(2, 1, HIDDEN, VOCAB, True))
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)) * scale)
        if poison is not None:
            poison(heads)
    return save_medusa_heads(heads, tmp_path / "heads", layout="fasterdecoding", base_model_name_or_path="org/base", weights_format=weights_format)


@pytest.mark.parametrize("weights_format", ["safetensors", "pt"])
def test_nan_medusa_heads_are_refused_naming_file_key_and_count(tmp_path, weights_format):
    def poison(heads):
        heads.lm_heads[1].weight[0, :3] = float("nan")
        heads.lm_heads[1].weight[1, 0] = float("inf")
        heads.blocks[1][0].linear.bias[0] = float("nan")

    out = _heads_dir(tmp_path, weights_format, poison)
    weights = out / f"medusa_lm_head.{weights_format}"
    # in file key order '1.0.linear.bias' comes before '1.1.weight'
    assert _error(lambda: load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)) == (
        f"{weights}: key '1.0.linear.bias' holds 1 non-finite value(s) (NaN or inf) of {HIDDEN} (torch.float32); "
        "1 other key(s) hold NaN/inf too; the heads are corrupt or diverged in training: re-download them, or re-train and re-export them"
    )


def test_medusa_heads_overflowing_the_requested_dtype_are_refused(tmp_path):
    out = _heads_dir(tmp_path, scale=1e5)  # randn * 1e5 exceeds float16's 65504 somewhere
    assert load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.bfloat16) is not None
    message = _error(lambda: load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float16))
    assert re.match(rf"{re.escape(str(out / 'medusa_lm_head.safetensors'))}: parameter '[\w.]+' holds \d+ non-finite value\(s\)", message)
    assert message.endswith("values beyond torch.float16's range became inf on the cast: load the heads in bfloat16 or float32")


# ---------------------------------------------------------------- pickles


def _assert_safe_refusal(info, path: Path) -> None:
    message = str(info.value)
    assert message.startswith(f"{path}: holds objects beyond tensors (")
    assert "specbench loads .pt files only with torch.load(weights_only=True) for safety" in message
    assert "convert the file to safetensors (safetensors.torch.save_file) in an environment you trust" in message
    # torch's advice is neither in the message nor in the traceback a user would see
    shown = "".join(traceback.format_exception(info.value))
    for advice in TORCH_ADVICE:
        assert advice not in message and advice not in shown, advice
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_pickled_class_instance_in_medusa_heads_is_refused_without_unsafe_advice(tmp_path):
    out = _heads_dir(tmp_path, "pt")
    path = out / "medusa_lm_head.pt"
    torch.save({"0.0.linear.weight": torch.zeros(HIDDEN, HIDDEN), "x": _Payload()}, path)
    with pytest.raises(CheckpointError) as info:
        load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)
    _assert_safe_refusal(info, path)
    assert "(it references test_corrupt_checkpoints._Payload)" in str(info.value)


def test_code_execution_payload_is_refused_and_never_runs(tmp_path):
    out = _heads_dir(tmp_path, "pt")
    path, marker = out / "medusa_lm_head.pt", tmp_path / "payload-ran"
    torch.save({"0.0.linear.weight": torch.zeros(HIDDEN, HIDDEN), "x": _RunsCode(str(marker))}, path)
    with pytest.raises(CheckpointError) as info:
        load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)
    _assert_safe_refusal(info, path)
    assert "makedirs" in str(info.value) and not marker.exists()


def test_target_pytorch_model_bin_with_a_pickle_payload_is_refused(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()
    path = tiny_dir / "pytorch_model.bin"
    torch.save({"lm_head.weight": torch.zeros(2), "x": _Payload()}, path)
    with pytest.raises(CheckpointError) as info:
        load_target_model(tiny_dir, dtype=torch.float32, device="cpu")
    _assert_safe_refusal(info, path)


def test_a_pickle_transformers_refuses_is_reported_without_torchs_advice(tiny_dir, monkeypatch):
    import pickle

    import transformers

    def refuse(cls, *args, **kwargs):
        raise pickle.UnpicklingError("Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely succeed")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(refuse))
    with pytest.raises(CheckpointError) as info:
        load_target_model(tiny_dir, dtype=torch.float32, device="cpu")
    assert str(info.value) == (
        f"{tiny_dir}: a weights file holds objects beyond tensors; specbench loads pickled weights only with "
        "torch.load(weights_only=True), for safety; convert them to safetensors in an environment you trust"
    )
    shown = "".join(traceback.format_exception(info.value))
    assert not [advice for advice in TORCH_ADVICE if advice in shown]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty file (0 bytes), expected a torch checkpoint"),
        (b"\x13" + bytes(63), "not a torch checkpoint: it is neither a zip archive (as torch.save writes) nor a pickle"),
    ],
)
def test_empty_or_foreign_pt_file(tmp_path, content, expected):
    out = _heads_dir(tmp_path, "pt")
    (out / "medusa_lm_head.pt").write_bytes(content)
    assert _error(lambda: load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)).startswith(f"{out / 'medusa_lm_head.pt'}: {expected}")


# ---------------------------------------------------------------- no unsafe loading anywhere


def _calls(name: str):
    """(file, line, call) for every call of an attribute `name` in specbench/ and bench/."""
    for path in sorted([*REPO.glob("specbench/**/*.py"), *REPO.glob("bench/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
                yield path.relative_to(REPO), node.lineno, node


def _keyword(call: ast.Call, name: str):
    return next((kw.value.value for kw in call.keywords if kw.arg == name and isinstance(kw.value, ast.Constant)), None)


def test_every_torch_load_passes_weights_only_true():
    loads = list(_calls("load"))
    torch_loads = [(path, line) for path, line, call in loads if isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"]
    assert torch_loads, "the scan found no torch.load at all"
    unsafe = [(path, line) for path, line, call in loads if (path, line) in torch_loads and _keyword(call, "weights_only") is not True]
    assert not unsafe, f"torch.load without weights_only=True at {unsafe}"


def test_trust_remote_code_is_never_enabled():
    enabled = [
        (path, line)
        for name in ("from_pretrained", "snapshot_download", "load_dataset")
        for path, line, call in _calls(name)
        if any(kw.arg == "trust_remote_code" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False) for kw in call.keywords)
    ]
    assert not enabled, f"trust_remote_code set to something other than False at {enabled}"
