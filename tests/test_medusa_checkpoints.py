"""Medusa checkpoints: every layout round-trips bit-exactly, configs are normalised, and every broken
file fails with a message naming the file and the key."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig

from specbench.checkpoints.medusa import MedusaCheckpointWarning, read_medusa_checkpoint
from specbench.checkpoints.medusa_config import (
    MedusaCheckpointError,
    MedusaConfig,
    load_medusa_config,
    register_medusa_config,
)
from specbench.checkpoints.tensor_files import CheckpointError
from specbench.checkpoints.tiny import tiny_llama
from specbench.medusa.checkpoint import load_medusa_heads, save_medusa_heads
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig

HIDDEN, VOCAB, HEADS = 32, 64, 5


class _NotATensor:
    """A class torch.load(weights_only=True) must refuse to unpickle."""


def random_heads(num_layers: int, *, has_vocab_projection: bool = True, dtype=torch.float32, seed: int = 0) -> MedusaHeads:
    heads = MedusaHeads(MedusaHeadsConfig(HEADS, num_layers, HIDDEN, VOCAB, has_vocab_projection))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            # random everywhere, biases included, so a dropped or zeroed tensor shows
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    for name, parameter in heads.named_parameters():
        assert parameter.abs().min() > 0, name
    return heads.to(dtype)


def assert_heads_equal(expected: MedusaHeads, actual: MedusaHeads) -> None:
    assert actual.config == expected.config
    want, got = expected.state_dict(), actual.state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert torch.equal(got[key], want[key]), key


def old_layout_keys(num_heads: int, num_layers: int) -> set[str]:
    """The keys of a published FasterDecoding medusa_lm_head file (docs/checkpoints.md)."""
    keys = set()
    for h in range(num_heads):
        for l in range(num_layers):
            keys |= {f"{h}.{l}.linear.weight", f"{h}.{l}.linear.bias"}
        keys.add(f"{h}.{num_layers}.weight")
    return keys


def file_keys(path) -> set[str]:
    if path.suffix == ".pt":
        return set(torch.load(path, map_location="cpu", weights_only=True))
    with safe_open(path, framework="pt") as f:
        return set(f.keys())


def test_fasterdecoding_key_names_match_the_published_layout(tmp_path):
    out = save_medusa_heads(random_heads(1), tmp_path / "old", layout="fasterdecoding", base_model_name_or_path="org/base", weights_format="pt")
    assert file_keys(out / "medusa_lm_head.pt") == old_layout_keys(HEADS, 1)
    assert "0.1.weight" in old_layout_keys(HEADS, 1)  # the vocab projection sits at index L


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("weights_format", ["pt", "safetensors"])
def test_round_trip_old_layout_then_vllm_layout(tmp_path, num_layers, weights_format):
    original = random_heads(num_layers)
    old_dir = save_medusa_heads(
        original, tmp_path / "old", layout="fasterdecoding", base_model_name_or_path="org/base", weights_format=weights_format
    )
    assert json.loads((old_dir / "config.json").read_text()) == {
        "base_model_name_or_path": "org/base",
        "medusa_num_heads": HEADS,
        "medusa_num_layers": num_layers,
    }
    assert sorted(p.name for p in old_dir.iterdir()) == ["config.json", f"medusa_lm_head.{weights_format}"]
    assert file_keys(old_dir / f"medusa_lm_head.{weights_format}") == old_layout_keys(HEADS, num_layers)

    checkpoint = read_medusa_checkpoint(old_dir)
    assert (checkpoint.layout, checkpoint.base_model_name_or_path, checkpoint.warnings) == ("fasterdecoding", "org/base", [])
    from_old = load_medusa_heads(old_dir, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert_heads_equal(original, from_old)

    vllm_dir = save_medusa_heads(from_old, tmp_path / "vllm", layout="vllm", base_model_name_or_path="org/base")
    config = json.loads((vllm_dir / "config.json").read_text())
    assert config["model_type"] == "medusa"
    assert (config["num_heads"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (HEADS, num_layers, HIDDEN, VOCAB)
    assert config["medusa_fc_bias"] is True  # else vLLM would build the blocks without their biases
    assert {f"blocks.4.layers.{num_layers - 1}.bias", "lm_heads.4.weight"} <= file_keys(vllm_dir / "model.safetensors")

    assert read_medusa_checkpoint(vllm_dir).layout == "vllm"
    from_vllm = load_medusa_heads(vllm_dir, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert_heads_equal(original, from_vllm)
    hidden_states = torch.randn(3, HIDDEN)
    assert torch.equal(from_vllm(hidden_states), original(hidden_states))  # (HEADS, 3, VOCAB)


def test_round_trip_keeps_bf16_and_dtype_argument_casts(tmp_path):
    original = random_heads(1, dtype=torch.bfloat16)
    out = save_medusa_heads(original, tmp_path / "bf16", layout="fasterdecoding", base_model_name_or_path="org/base")
    assert_heads_equal(original, load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB))
    as_fp32 = load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float32)
    assert_heads_equal(original.to(torch.float32), as_fp32)


@pytest.mark.parametrize("weights_format", ["pt", "safetensors"])
def test_version_2_round_trip(tmp_path, weights_format):
    original = random_heads(2, has_vocab_projection=False)
    out = save_medusa_heads(original, tmp_path / "v2", layout="fasterdecoding", base_model_name_or_path="org/base", weights_format=weights_format)
    assert json.loads((out / "config.json").read_text())["version"] == "2"
    assert file_keys(out / f"medusa_lm_head.{weights_format}") == old_layout_keys(HEADS, 2) - {f"{h}.2.weight" for h in range(HEADS)}

    checkpoint = read_medusa_checkpoint(out)
    assert checkpoint.layout == "fasterdecoding-v2" and not checkpoint.config.has_vocab_projection
    loaded = load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert loaded.lm_heads is None
    assert_heads_equal(original, loaded)
    target_lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden_states = torch.randn(2, HIDDEN)
    assert torch.equal(loaded(hidden_states, target_lm_head), original(hidden_states, target_lm_head))
    with pytest.raises(ValueError, match="version-2 heads"):
        save_medusa_heads(loaded, tmp_path / "v2_vllm", layout="vllm", base_model_name_or_path="org/base")


@pytest.mark.parametrize("sharded", [False, True])
def test_medusa2_whole_model_heads_are_extracted(tmp_path, sharded):
    num_layers = 2
    original = random_heads(num_layers)
    base = tiny_llama(seed=1, vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=1)
    tensors = {key: value.contiguous() for key, value in base.state_dict().items()}
    for key, value in original.state_dict().items():
        # Medusa-2 keeps each head as nn.Sequential(*blocks, vocab Linear) under medusa_head
        part = key.split(".")
        name = f"medusa_head.{part[1]}.{part[2]}.linear.{part[-1]}" if part[0] == "blocks" else f"medusa_head.{part[1]}.{num_layers}.weight"
        tensors[name] = value.clone()
    out = tmp_path / "whole"
    out.mkdir()
    config = base.config.to_dict() | {"medusa_num_heads": HEADS, "medusa_num_layers": num_layers, "base_model_name_or_path": "org/base"}
    (out / "config.json").write_text(json.dumps(config))
    if sharded:
        keys = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
        for shard, shard_keys in shards.items():
            save_file({key: tensors[key] for key in shard_keys}, out / shard)
        weight_map = {key: shard for shard, shard_keys in shards.items() for key in shard_keys}
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        save_file(tensors, out / "model.safetensors")

    checkpoint = read_medusa_checkpoint(out)
    assert (checkpoint.layout, checkpoint.base_model_name_or_path, checkpoint.warnings) == ("medusa2", "org/base", [])
    assert_heads_equal(original, load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB))


def _published_style_checkpoint(tmp_path, weights_format="pt"):
    """Like medusa-vicuna-7b-v1.3: config.json says 2 heads, the weights hold 5."""
    original = random_heads(1)
    out = save_medusa_heads(original, tmp_path / "published", layout="fasterdecoding", base_model_name_or_path="org/base", weights_format=weights_format)
    (out / "config.json").write_text(
        json.dumps({"base_model_name_or_path": "org/base", "medusa_num_heads": 2, "medusa_num_layers": 1, "transformers_version": "4.31.0"})
    )
    return original, out


def test_config_head_count_disagreeing_with_the_weights_warns_and_the_keys_win(tmp_path):
    original, out = _published_style_checkpoint(tmp_path)
    warning = rf"{re.escape(str(out / 'config.json'))}: medusa_num_heads = 2 but {re.escape(str(out / 'medusa_lm_head.pt'))} holds 5"
    with pytest.warns(MedusaCheckpointWarning, match=warning):
        all_heads = load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert_heads_equal(original, all_heads)

    with pytest.warns(MedusaCheckpointWarning, match=warning):
        first_three = load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=3)
    assert first_three.config.num_heads == 3
    want = {key: value for key, value in original.state_dict().items() if int(key.split(".")[1]) < 3}
    got = first_three.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[key], want[key]) for key in want)

    with pytest.warns(MedusaCheckpointWarning), pytest.raises(MedusaCheckpointError, match=r"num_heads=6 asked for, but the file holds 5 heads"):
        load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=6)


def test_vllm_checkpoint_without_biases_loads_zero_biases_only_when_config_says_so(tmp_path):
    out = save_medusa_heads(random_heads(1), tmp_path / "vllm", layout="vllm", base_model_name_or_path="org/base")
    with safe_open(out / "model.safetensors", framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys() if not key.endswith(".bias")}
    save_file(tensors, out / "model.safetensors")
    # medusa_fc_bias true but no biases in the file: the biases are missing, not zero
    with pytest.raises(MedusaCheckpointError, match=r"(?s)model\.safetensors.*missing keys.*'blocks\.0\.layers\.0\.bias'"):
        load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)

    config = json.loads((out / "config.json").read_text()) | {"medusa_fc_bias": False}
    (out / "config.json").write_text(json.dumps(config))
    heads = load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert torch.equal(heads.blocks[0][0].linear.bias, torch.zeros(HIDDEN))
    assert torch.equal(heads.lm_heads[4].weight, tensors["lm_heads.4.weight"])


# ---------------------------------------------------------------- broken checkpoints


def _rewrite_weights(out, edit, weights_format="safetensors"):
    path = out / f"medusa_lm_head.{weights_format}"
    if weights_format == "pt":
        tensors = torch.load(path, weights_only=True)
    else:
        with safe_open(path, framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    edit(tensors)
    if weights_format == "pt":
        torch.save(tensors, path)
    else:
        save_file({key: value.contiguous() for key, value in tensors.items()}, path)
    return path


@pytest.fixture
def old_dir(tmp_path):
    return save_medusa_heads(random_heads(1), tmp_path / "old", layout="fasterdecoding", base_model_name_or_path="org/base")


def test_missing_bias_names_file_and_key(old_dir):
    path = _rewrite_weights(old_dir, lambda t: t.pop("1.0.linear.bias"))
    with pytest.raises(MedusaCheckpointError, match=rf"(?s){re.escape(str(path))}.*missing keys \(1\): '1\.0\.linear\.bias'"):
        load_medusa_heads(old_dir, hidden_size=HIDDEN, vocab_size=VOCAB)


def test_unexpected_key_names_file_and_key(old_dir):
    path = _rewrite_weights(old_dir, lambda t: t.update({"extra.weight": torch.ones(2)}))
    with pytest.raises(MedusaCheckpointError, match=rf"(?s){re.escape(str(path))}.*unexpected keys \(1\): 'extra\.weight'"):
        load_medusa_heads(old_dir, hidden_size=HIDDEN, vocab_size=VOCAB)


def test_transposed_vocab_projection_names_file_key_and_shapes(old_dir):
    path = _rewrite_weights(old_dir, lambda t: t.update({"2.1.weight": t["2.1.weight"].T.contiguous()}))
    with pytest.raises(
        MedusaCheckpointError, match=rf"(?s){re.escape(str(path))}.*'2\.1\.weight' has shape \(32, 64\), expected \(64, 32\) \(it looks transposed\)"
    ):
        load_medusa_heads(old_dir, hidden_size=HIDDEN, vocab_size=VOCAB)


def test_vocab_mismatch_with_target_names_file_key_and_shapes(old_dir):
    with pytest.raises(MedusaCheckpointError, match=r"(?s)medusa_lm_head\.safetensors.*'0\.1\.weight' has shape \(64, 32\), expected \(72, 32\)"):
        load_medusa_heads(old_dir, hidden_size=HIDDEN, vocab_size=72)


def test_hidden_size_mismatch_with_target_is_an_error(old_dir):
    with pytest.raises(MedusaCheckpointError, match=r"(?s)'0\.0\.linear\.weight' has shape \(32, 32\), expected \(48, 48\)"):
        load_medusa_heads(old_dir, hidden_size=48, vocab_size=VOCAB)


@pytest.mark.parametrize("weights_format", ["pt", "safetensors"])
def test_truncated_file_names_the_file(tmp_path, weights_format):
    out = save_medusa_heads(random_heads(1), tmp_path / "old", layout="fasterdecoding", base_model_name_or_path="org/base", weights_format=weights_format)
    path = out / f"medusa_lm_head.{weights_format}"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    # a torch zip archive cut short cannot tell how much is missing; a safetensors header can
    expected = (
        r"it starts as a zip archive .* but its \d+ bytes end without" if weights_format == "pt"
        else r"header says \d+ bytes of data but the file holds \d+"
    )
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: truncated: {expected}.*; re-download it"):
        load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)


def test_non_tensor_pickle_is_refused_naming_the_file(old_dir):
    (old_dir / "medusa_lm_head.safetensors").unlink()
    path = old_dir / "medusa_lm_head.pt"
    torch.save({"0.0.linear.weight": _NotATensor()}, path)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: holds objects beyond tensors \(it references [\w.]*_NotATensor\)") as info:
        load_medusa_heads(old_dir, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert "torch.load(weights_only=True)" in str(info.value) and "weights_only=False" not in str(info.value)


def test_plain_python_value_instead_of_tensor_names_the_key(tmp_path):
    out = save_medusa_heads(random_heads(1), tmp_path / "old", layout="fasterdecoding", base_model_name_or_path="org/base", weights_format="pt")
    path = _rewrite_weights(out, lambda t: t.update({"3.0.linear.bias": [0.5] * HIDDEN}), weights_format="pt")
    with pytest.raises(MedusaCheckpointError, match=rf"(?s){re.escape(str(path))}.*'3\.0\.linear\.bias' holds a list, expected a tensor"):
        load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)


def test_directory_without_weights_lists_what_was_looked_for(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(MedusaCheckpointError, match=r"no Medusa weights file; looked for medusa_lm_head\.safetensors, medusa_lm_head\.pt"):
        read_medusa_checkpoint(tmp_path)


def test_export_refuses_a_non_empty_directory(tmp_path, old_dir):
    with pytest.raises(FileExistsError, match="not an empty directory"):
        save_medusa_heads(random_heads(1), old_dir, layout="fasterdecoding", base_model_name_or_path="org/base")
    assert not [p for p in old_dir.parent.iterdir() if p.name.endswith(".partial")]  # no staging left behind


# ---------------------------------------------------------------- config normalisation


def test_old_config_is_normalised_for_autoconfig_without_touching_the_directory(tmp_path):
    _, out = _published_style_checkpoint(tmp_path)
    before = (out / "config.json").read_bytes()
    with pytest.raises(ValueError):
        AutoConfig.from_pretrained(out)  # no model_type: transformers cannot tell what it is

    config = load_medusa_config(out, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert isinstance(config, MedusaConfig) and config.model_type == "medusa"
    assert (config.num_heads, config.num_hidden_layers, config.base_model_name_or_path) == (2, 1, "org/base")
    assert (config.hidden_size, config.vocab_size) == (HIDDEN, VOCAB)
    assert not hasattr(config, "medusa_num_heads")

    config.save_pretrained(tmp_path / "normalised")
    via_auto = AutoConfig.from_pretrained(tmp_path / "normalised")
    assert isinstance(via_auto, MedusaConfig)
    assert (via_auto.num_heads, via_auto.num_hidden_layers, via_auto.base_model_name_or_path) == (2, 1, "org/base")
    assert (out / "config.json").read_bytes() == before


def test_register_medusa_config_is_idempotent(recwarn):
    register_medusa_config()
    register_medusa_config()
    assert not [w for w in recwarn if "medusa" in str(w.message)]
    assert isinstance(AutoConfig.for_model("medusa", num_heads=3), MedusaConfig)


def test_config_conflicts_are_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 5, "num_heads": 4}))
    with pytest.raises(MedusaCheckpointError, match=r"config\.json: num_heads = 4 but medusa_num_heads = 5"):
        load_medusa_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(MedusaCheckpointError, match=r"config\.json: model_type is 'llama'"):
        load_medusa_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 5, "hidden_size": 64}))
    with pytest.raises(MedusaCheckpointError, match=r"hidden_size = 64 but the target's is 32"):
        load_medusa_config(tmp_path, hidden_size=32)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": -3}))
    with pytest.raises(MedusaCheckpointError, match=r"(?s)config\.json: .*num_heads = -3, expected an integer >= 1.*medusa_num_heads -> num_heads"):
        load_medusa_config(tmp_path)
