"""The EAGLE-3 layout vLLM loads (speculators' config.json, ``layers.0.*`` keys, an optional own embed_tokens):
a hand-built checkpoint loads and equals the same weights in SafeAILab's layout, matches a forward written out
from the file's own keys, decodes losslessly through the proposer, and every malformed variant or unsupported
feature is refused naming the file and the key or field (docs/eagle.md#vllm-speculators-layout)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from specbench.eagle.checkpoint import Eagle3CheckpointError
from specbench.eagle.checkpoint3 import load_eagle3_head, save_eagle3_head
from specbench.eagle.eagle3 import Eagle3Head
from specbench.engine.hf_target import HFTarget
from specbench.engine.static_target import StaticTarget
from specbench.proposers import create_proposer
from test_eagle import decode_losslessly
from test_eagle_checkpoint_files import assert_refused, put
from test_eagle3 import DRAFT_VOCAB, MODES, deep_llama, random_head3, shift_d2t
from test_static_target import HIDDEN, VOCAB

LAYER = ["input_layernorm.weight", "hidden_norm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
         "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
         "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
WEIGHTS = "model.safetensors"


def flagged(head: Eagle3Head, norm_before_residual: bool) -> Eagle3Head:
    """``head``'s weights under a config with ``norm_before_residual`` set as asked."""
    if head.config.norm_before_residual == norm_before_residual:
        return head
    config = dataclasses.replace(head.config, norm_before_residual=norm_before_residual)
    out = Eagle3Head(config, with_vocab_map=head.d2t is not None)
    out.load_state_dict(head.state_dict())
    return out.prepare()


def speculators_state(head: Eagle3Head, *, embed: torch.Tensor | None = None, vocab_map: bool = True) -> dict:
    """The weights as speculators saves them, key by key: fp32 floats, int64 d2t, bool t2d."""
    own = head.state_dict()
    state = {"fc.weight": own["fc.weight"], "norm.weight": own["norm.weight"], "lm_head.weight": own["lm_head.weight"]}
    state.update({f"layers.0.{key}": own[f"midlayer.{key}"] for key in LAYER})
    state = {key: t.detach().to(torch.float32).contiguous().clone() for key, t in state.items()}
    if embed is not None:
        state["embed_tokens.weight"] = embed.detach().to(torch.float32).clone()
    if vocab_map:
        state["d2t"], state["t2d"] = head.d2t.clone().to(torch.int64), head.t2d.clone().to(torch.bool)
    return state


def speculators_config(draft_vocab: int, **top) -> dict:
    """config.json as speculators writes it for random_head3's shape."""
    layer = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB, "hidden_size": HIDDEN,
             "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": HIDDEN // 4, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
             "max_position_embeddings": 256, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
             "torch_dtype": "float32"}
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}},
            "transformer_layer_config": layer, "draft_vocab_size": draft_vocab, "norm_before_residual": False,
            "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": None, "norm_before_fc": False,
            "fc_norm": False, "norm_output": False, "embed_requires_grad": False, "torch_dtype": "float32", **top}


def write(directory, config: dict, state: dict):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(state, directory / WEIGHTS, metadata={"format": "pt"})
    return directory


def hand_built(tmp_path, head: Eagle3Head, *, embed=None, vocab_map=True, name="spec", **top):
    config = speculators_config(head.config.draft_vocab_size, norm_before_residual=head.config.norm_before_residual, **top)
    return write(tmp_path / name, config, speculators_state(head, embed=embed, vocab_map=vocab_map))


def load(path, **kw):
    return load_eagle3_head(path, target_hidden_size=HIDDEN, target_vocab_size=VOCAB, **kw)


def file_reference(state: dict, norm_before_residual: bool, embeds, features) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' first layer written out from the file's own keys (causal, no cache): (pre-norm outputs, logits)."""
    w = lambda key: state[f"layers.0.{key}.weight"]
    norm = lambda x, weight: weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    width, nh, kvh, d = embeds.shape[0], 4, 2, HIDDEN // 4
    fused = features @ state["fc.weight"].T  # (W, H)
    normed = norm(fused, w("hidden_norm"))
    x = torch.cat([norm(embeds, w("input_layernorm")), normed], dim=-1)  # (W, 2H)
    q = (x @ w("self_attn.q_proj").T).view(width, nh, d).transpose(0, 1)
    k = (x @ w("self_attn.k_proj").T).view(width, kvh, d).transpose(0, 1).repeat_interleave(nh // kvh, 0)
    v = (x @ w("self_attn.v_proj").T).view(width, kvh, d).transpose(0, 1).repeat_interleave(nh // kvh, 0)
    cos, sin = LlamaRotaryEmbedding(LlamaConfig(hidden_size=HIDDEN, num_attention_heads=nh, max_position_embeddings=256))(
        x[None], torch.arange(width)[None])
    q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
    scores = (q[0] @ k[0].transpose(-1, -2)) / math.sqrt(d) + torch.full((width, width), -torch.inf).triu_(1)
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(width, nh * d) @ w("self_attn.o_proj").T  # (W, H)
    h = (normed if norm_before_residual else fused) + attn
    post = norm(h, w("post_attention_layernorm"))
    out = h + (nn.functional.silu(post @ w("mlp.gate_proj").T) * (post @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
    return out, norm(out, state["norm.weight"]) @ state["lm_head.weight"].T


def _inputs(width: int = 9):
    gen = torch.Generator().manual_seed(5)
    return torch.randn(width, HIDDEN, generator=gen), torch.randn(width, 3 * HIDDEN, generator=gen)


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize(("norm_before_residual", "draft_vocab", "vocab_map", "with_embed"), [
    (False, DRAFT_VOCAB, True, False), (True, DRAFT_VOCAB, True, True), (False, VOCAB, False, True), (True, VOCAB, True, False),
], ids=["small-vocab", "norm-before-residual-own-embed", "full-vocab-no-map", "norm-before-residual-full-vocab"])
def test_hand_built_checkpoint_equals_the_safeailab_layout(tmp_path, norm_before_residual, draft_vocab, vocab_map, with_embed):
    head = flagged(random_head3(draft_vocab=draft_vocab), norm_before_residual)
    embed = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(2)) if with_embed else None
    spec = load(hand_built(tmp_path, head, embed=embed, vocab_map=vocab_map))
    safe = load(save_eagle3_head(tmp_path / "safe", head, with_vocab_map=vocab_map))
    assert spec.config == safe.config and spec.config.norm_before_residual is norm_before_residual
    assert (spec.embed_tokens is not None) is with_embed and safe.embed_tokens is None
    if with_embed:
        assert torch.equal(spec.embed_tokens.weight, embed)
    assert torch.equal(spec.draft_to_target(), safe.draft_to_target())
    embeds, features = _inputs()
    positions = torch.arange(len(embeds))
    got, want = spec(embeds, features, positions, spec.new_cache()), safe(embeds, features, positions, safe.new_cache())
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(spec.logits(got), safe.logits(want), atol=0, rtol=0)
    state = load_file(tmp_path / "spec" / WEIGHTS)
    out, logits = file_reference(state, norm_before_residual, embeds, features)
    torch.testing.assert_close(got, out, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(spec.logits(got), logits, atol=1e-4, rtol=1e-5)


def test_norm_before_residual_defaults_to_true_when_absent(tmp_path):
    """vLLM's speculators adapter reads a missing norm_before_residual as true."""
    directory = hand_built(tmp_path, random_head3(draft_vocab=DRAFT_VOCAB))
    config = json.loads((directory / "config.json").read_text())
    del config["norm_before_residual"]
    (directory / "config.json").write_text(json.dumps(config))
    assert load(directory).config.norm_before_residual is True


def test_flat_config_with_layer_names_loads(tmp_path):
    """A Llama-style config.json (no speculators marker) over ``layers.0.*`` keys is the vLLM naming too."""
    head = random_head3(draft_vocab=DRAFT_VOCAB)
    flat = {**head.config.to_json(), "torch_dtype": "float32"}
    directory = write(tmp_path / "flat", flat, speculators_state(head))
    loaded = load(directory)
    assert loaded.config == head.config
    embeds, features = _inputs()
    positions = torch.arange(len(embeds))
    torch.testing.assert_close(loaded(embeds, features, positions, loaded.new_cache()),
                               head(embeds, features, positions, head.new_cache()), atol=0, rtol=0)


def test_writer_produces_the_hand_built_layout(tmp_path):
    head = flagged(random_head3(draft_vocab=DRAFT_VOCAB), True)
    with_embed = Eagle3Head(head.config, with_embed=True)
    with_embed.load_state_dict({**head.state_dict(), "embed_tokens.weight": torch.ones(VOCAB, HIDDEN)})
    with_embed.prepare()
    out = save_eagle3_head(tmp_path / "written", with_embed, layout="speculators", target_num_layers=32, verifier="v")
    want = speculators_state(head, embed=torch.ones(VOCAB, HIDDEN))
    got = load_file(out / WEIGHTS)
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    config = json.loads((out / "config.json").read_text())
    hand = speculators_config(DRAFT_VOCAB, norm_before_residual=True, eagle_aux_hidden_state_layer_ids=[2, 16, 29])
    for key in ("speculators_model_type", "draft_vocab_size", "norm_before_residual", "target_hidden_size",
                "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm", "norm_output"):
        assert config[key] == hand[key], key
    assert config["speculators_config"]["verifier"]["name_or_path"] == "v"
    layer = config["transformer_layer_config"]
    assert all(layer[k] == v for k, v in hand["transformer_layer_config"].items() if k != "rope_theta"), layer
    loaded = load(out, target_num_layers=32)
    assert loaded.config == head.config and torch.equal(loaded.embed_tokens.weight, torch.ones(VOCAB, HIDDEN))
    with pytest.raises(ValueError, match="layout='speculators'"):
        save_eagle3_head(tmp_path / "safe", with_embed)


# ---------------------------------------------------------------- lossless decoding


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_greedy_decoding_through_a_speculators_checkpoint_is_lossless(tmp_path, engine, mode):
    model = deep_llama()
    head = flagged(random_head3(draft_vocab=DRAFT_VOCAB), True)
    target_embed = model.get_input_embeddings().weight
    # the target's own embedding (as speculators ships it): the same drafts as the SafeAILab head
    spec_path = hand_built(tmp_path, head, embed=target_embed, name="same-embed")
    safe_path = save_eagle3_head(tmp_path / "safe", head)
    counters = []
    for path in (spec_path, safe_path):
        target = HFTarget(model) if engine == "eager" else StaticTarget.from_hf_model(model)
        proposer = create_proposer("eagle3", target, path=str(path), **MODES[mode])
        results = decode_losslessly(model, target, proposer)
        counters.append([(r.counters.num_drafts, r.counters.num_accepted_tokens) for r in results])
    assert counters[0] == counters[1] and sum(n for n, _ in counters[0]) > 0
    # an embedding of its own, unlike the target's: the proposer embeds with it, still losslessly
    own = hand_built(tmp_path, head, embed=torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(9)),
                     name="own-embed")
    target = HFTarget(model) if engine == "eager" else StaticTarget.from_hf_model(model)
    proposer = create_proposer("eagle3", target, path=str(own), **MODES[mode])
    assert proposer.embedding is proposer.head.embed_tokens
    decode_losslessly(model, target, proposer)


# ---------------------------------------------------------------- refusals


WEIGHT_VARIANTS = {  # variant -> (edit of the safetensors state, what the message must say besides the file)
    "missing-key": (lambda s: s.pop("layers.0.hidden_norm.weight"), "key 'layers.0.hidden_norm.weight' is missing"),
    "second-layer": (put("layers.1.mlp.up_proj.weight", torch.zeros(128, HIDDEN)),
                     "unexpected key 'layers.1.mlp.up_proj.weight'; a second decoder layer"),
    "mixed-names": (put("midlayer.hidden_norm.weight", torch.ones(HIDDEN)),
                    "unexpected key 'midlayer.hidden_norm.weight'; the speculators layout names the layer layers.0.*"),
    "parallel-drafting": (put("mask_hidden", torch.zeros(1, 3 * HIDDEN)), "unexpected key 'mask_hidden'; a parallel-drafting"),
    "norm-before-fc": (put("input_norm.weight", torch.ones(3 * HIDDEN)), "unexpected key 'input_norm.weight'; a norm before fc"),
    "verifier-head": (put("verifier_lm_head.weight", torch.zeros(DRAFT_VOCAB, HIDDEN)), "unexpected key 'verifier_lm_head.weight'"),
    "embed-vocab": (put("embed_tokens.weight", torch.zeros(128, HIDDEN)),
                    "'embed_tokens.weight' has shape (128, 64), expected (256, 64)"),
    "q-proj-h": (put("layers.0.self_attn.q_proj.weight", torch.zeros(64, HIDDEN)),
                 "'layers.0.self_attn.q_proj.weight' has shape (64, 64), expected (64, 128)"),
    "embed-int": (put("embed_tokens.weight", torch.zeros(VOCAB, HIDDEN, dtype=torch.int32)),
                  "key 'embed_tokens.weight' holds a torch.int32 tensor"),
    "d2t-out-of-range": (shift_d2t, "key 'd2t' maps draft id 95 to target id"),
    "t2d-dtype": (lambda s: s.update(t2d=s["t2d"].to(torch.uint8)), "key 't2d' holds a torch.uint8 tensor"),
    "d2t-missing": (lambda s: (s.pop("d2t"), s.pop("t2d")), "key 'd2t' is missing"),
    "nan-embed": (lambda s: s["embed_tokens.weight"].view(-1).__setitem__(7, math.nan), "'embed_tokens.weight' holds 1 non-finite"),
    "inf-layer": (lambda s: s["layers.0.mlp.down_proj.weight"].view(-1).__setitem__(0, math.inf),
                  "'layers.0.mlp.down_proj.weight' holds 1 non-finite"),
}


@pytest.mark.parametrize("variant", sorted(WEIGHT_VARIANTS))
def test_malformed_weights_name_file_and_key(tmp_path, variant):
    edit, message = WEIGHT_VARIANTS[variant]
    head = random_head3(draft_vocab=DRAFT_VOCAB)
    state = speculators_state(head, embed=torch.zeros(VOCAB, HIDDEN))
    edit(state)
    directory = write(tmp_path / "spec", speculators_config(DRAFT_VOCAB), state)
    assert_refused(Eagle3CheckpointError, load_eagle3_head, directory, WEIGHTS, message)


def _layer(**fields):
    return lambda c: c["transformer_layer_config"].update(fields)


CONFIG_VARIANTS = {  # variant -> (edit of config.json, message)
    "other-algorithm": (lambda c: c.update(speculators_model_type="eagle"), "speculators_model_type = 'eagle'"),
    "no-layer-config": (lambda c: c.pop("transformer_layer_config"), "transformer_layer_config = None, expected an object"),
    "two-layers": (_layer(num_hidden_layers=2), "transformer_layer_config.num_hidden_layers = 2"),
    "qwen3-layer": (_layer(model_type="qwen3"), "transformer_layer_config.model_type = 'qwen3'"),
    "attention-bias": (_layer(attention_bias=True), "transformer_layer_config.attention_bias = True"),
    "gelu": (_layer(hidden_act="gelu"), "transformer_layer_config.hidden_act = 'gelu'"),
    "no-hidden-size": (lambda c: c["transformer_layer_config"].pop("hidden_size"), "transformer_layer_config.hidden_size: missing"),
    "head-dim": (_layer(head_dim=32), "transformer_layer_config.head_dim = 32"),
    "norm-before-fc": (lambda c: c.update(norm_before_fc=True), "norm_before_fc = True; Eagle3Head has no such norm"),
    "fc-norm": (lambda c: c.update(fc_norm=True), "fc_norm = True"),
    "norm-output": (lambda c: c.update(norm_output=True), "norm_output = True"),
    "no-aux-features": (lambda c: c.update(eagle_config={"use_aux_hidden_state": False}),
                        "eagle_config.use_aux_hidden_state = False"),
    "residual-flag-type": (lambda c: c.update(norm_before_residual="yes"), "norm_before_residual = 'yes', expected a bool"),
    "target-hidden": (lambda c: c.update(target_hidden_size=2 * HIDDEN), "target_hidden_size = 128 differs"),
    "draft-vocab": (lambda c: c.update(draft_vocab_size=2 * VOCAB), "draft_vocab_size = 512 exceeds"),
    "aux-layers-form": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 5, 9]),
                        "eagle_aux_hidden_state_layer_ids = [1, 5, 9]; specbench feeds the layers (2, L // 2, L - 3)"),
    "aux-layers-count": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 16]), "fuses exactly 3 target layers"),
    "target-hidden-size": (_layer(hidden_size=2 * HIDDEN, num_attention_heads=8, head_dim=16),
                           f"hidden_size = {2 * HIDDEN}, but the target's is {HIDDEN}"),
}


@pytest.mark.parametrize("variant", sorted(CONFIG_VARIANTS))
def test_malformed_or_unsupported_config_names_the_field(tmp_path, variant):
    edit, message = CONFIG_VARIANTS[variant]
    config = speculators_config(DRAFT_VOCAB)
    edit(config)
    directory = write(tmp_path / "spec", config, speculators_state(random_head3(draft_vocab=DRAFT_VOCAB)))
    assert_refused(Eagle3CheckpointError, load_eagle3_head, directory, "config.json", message)


def test_aux_layers_are_checked_against_the_target(tmp_path):
    config = speculators_config(DRAFT_VOCAB, eagle_aux_hidden_state_layer_ids=[2, 16, 29])
    directory = write(tmp_path / "spec", config, speculators_state(random_head3(draft_vocab=DRAFT_VOCAB)))
    assert load(directory, target_num_layers=32).config.draft_vocab_size == DRAFT_VOCAB
    assert load(directory).config.draft_vocab_size == DRAFT_VOCAB  # no layer count given: the form alone is checked
    with pytest.raises(Eagle3CheckpointError, match=r"specbench feeds layers \[2, 2, 1\] of this 4-layer target"):
        load(directory, target_num_layers=4)
