"""EAGLE-1/2 checkpoint files: the published layout round-trips (bin and safetensors, with and without the
embedding, Llama-3 rope) and every malformed variant gets a clear error naming the file and the key (docs/eagle.md).
The helpers that corrupt a saved head are shared with the EAGLE-3 tests."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specbench.eagle.checkpoint import EagleCheckpointError, expected_shapes, load_eagle_head, save_eagle_head
from test_eagle import from_scratch, head_inputs, random_head
from test_static_target import HIDDEN, LLAMA3, VOCAB


@pytest.mark.parametrize(("fmt", "with_embed", "bias", "rope"), [
    ("bin", True, True, None), ("bin", False, True, None), ("safetensors", True, True, None), ("bin", True, False, LLAMA3),
], ids=["bin", "bin-no-embed", "safetensors", "llama3-bias-false"])
def test_checkpoint_round_trip(tmp_path, fmt, with_embed, bias, rope):
    head = random_head(with_embed=with_embed, bias=bias, rope_scaling=rope)
    out = save_eagle_head(tmp_path / "head", head, format=fmt, with_embed=with_embed)
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["config.json", "pytorch_model.bin" if fmt == "bin" else "model.safetensors"])
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["bias"] is bias and config["model_type"] == "llama"
    if fmt == "bin":
        keys = set(torch.load(out / "pytorch_model.bin", weights_only=True))
        assert keys == set(expected_shapes(head.config)) | ({"embed_tokens.weight"} if with_embed else set())
        assert ("fc.bias" in keys) is bias and not any("input_layernorm" in k for k in keys)
    loaded = load_eagle_head(out, target_hidden_size=HIDDEN, target_vocab_size=VOCAB, dtype=torch.float32)
    assert loaded.config == head.config and (loaded.embed_tokens is None) is (not with_embed)
    want, got = head.state_dict(), loaded.state_dict()
    assert want.keys() - ({"embed_tokens.weight"} if not with_embed else set()) == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in got)
    embeds, features = head_inputs(9)
    torch.testing.assert_close(from_scratch(loaded, embeds, features), from_scratch(head, embeds, features), atol=0, rtol=0)


def rewrite_weights(directory, edit) -> None:
    """Apply ``edit`` to the state dict in pytorch_model.bin (written by the test, read back weights_only)."""
    state = torch.load(directory / "pytorch_model.bin", weights_only=True)
    edit(state)
    torch.save(state, directory / "pytorch_model.bin")


def put(key: str, tensor: torch.Tensor):
    return lambda state: state.update({key: tensor})


def assert_refused(error: type[Exception], load, directory, file: str, message: str, **sizes) -> None:
    """Loading ``directory`` (test target, or ``sizes``) raises ``error`` naming its ``file`` and ``message``."""
    with pytest.raises(error) as refusal:
        load(directory, **{"target_hidden_size": HIDDEN, "target_vocab_size": VOCAB, **sizes})
    assert str(directory / file) in str(refusal.value) and message in str(refusal.value), str(refusal.value)


def poison(key: str):
    return lambda state: state[key].view(-1).__setitem__(0, math.nan)


MALFORMED = {  # variant -> (edit of the state dict, what the message must say besides the file)
    "missing-key": (lambda state: state.pop("layers.0.mlp.up_proj.weight"), "'layers.0.mlp.up_proj.weight' is missing"),
    "unexpected-key": (put("layers.0.extra.weight", torch.zeros(3)), "unexpected key 'layers.0.extra.weight'"),
    "wrong-shape": (put("fc.weight", torch.zeros(HIDDEN, HIDDEN)), "'fc.weight' has shape (64, 64), expected (64, 128)"),
    "input-layernorm": (put("layers.0.input_layernorm.weight", torch.ones(HIDDEN)), "not an EAGLE-1/2 layout"),
    "eagle3-key": (put("midlayer.hidden_norm.weight", torch.ones(HIDDEN)), "EAGLE-3"),
    "nan": (poison("layers.0.mlp.down_proj.weight"), "'layers.0.mlp.down_proj.weight' holds 1 non-finite"),
    "embed-vocab": (put("embed_tokens.weight", torch.zeros(VOCAB // 2, HIDDEN)), "does not fit the target's 256"),
}


@pytest.mark.parametrize("variant", sorted(MALFORMED))
def test_malformed_weights_name_file_and_key(tmp_path, variant):
    edit, message = MALFORMED[variant]
    out = save_eagle_head(tmp_path / "head", random_head())
    rewrite_weights(out, edit)
    assert_refused(EagleCheckpointError, load_eagle_head, out, "pytorch_model.bin", message)


def test_bias_flag_must_agree_with_the_weights(tmp_path):
    out = save_eagle_head(tmp_path / "head", random_head(bias=False))
    rewrite_weights(out, put("fc.bias", torch.zeros(HIDDEN)))
    assert_refused(EagleCheckpointError, load_eagle_head, out, "pytorch_model.bin",
                   'says "bias": false, yet the file holds an fc bias')
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    assert_refused(EagleCheckpointError, load_eagle_head, out, "config.json", "num_hidden_layers = 2")
