"""EAGLE-3: the published checkpoint layout loads (with and without d2t/t2d) and every malformed variant names its
file and key (either loader's too, for a head of another target's sizes); greedy decoding with random heads is
lossless on both targets; d2t maps draft ids to target ids (docs/eagle.md#eagle-3)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from specbench.eagle.checkpoint import Eagle3CheckpointError, EagleCheckpointError, load_eagle_head, save_eagle_head
from specbench.eagle.checkpoint3 import expected_shapes3, load_eagle3_head, save_eagle3_head
from specbench.eagle.eagle3 import Eagle3Config, Eagle3Head, eagle3_aux_layers
from specbench.engine.hf_target import HFTarget
from specbench.engine.proposer import ProposerState
from specbench.engine.static_target import StaticTarget
from specbench.proposers import create_proposer
from specbench.proposers.eagle3 import Eagle3Proposer
from _prompts import random_prompt
from test_eagle import decode_losslessly, random_head
from test_eagle_checkpoint_files import assert_refused, poison, put, rewrite_weights
from test_static_target import COMMON, HIDDEN, VOCAB, build

MODES = {"chain": dict(num_speculative_tokens=3), "dynamic-tree": dict(top_k=3, depth=4, total_tokens=12)}
DRAFT_VOCAB = 96


def random_head3(seed: int = 1, *, draft_vocab: int = VOCAB, std: float = 0.2) -> Eagle3Head:
    config = Eagle3Config(HIDDEN, 128, 4, 2, VOCAB, max_position_embeddings=256, draft_vocab_size=draft_vocab)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = Eagle3Head(config)
        for name, p in head.named_parameters():
            nn.init.normal_(p, mean=1.0 if name.endswith("norm.weight") else 0.0, std=std)
        if draft_vocab < VOCAB:  # a random subset of the target's ids, ascending as upstream builds it
            chosen = torch.randperm(VOCAB)[:draft_vocab].sort().values
            head.d2t.copy_(chosen - torch.arange(draft_vocab))
            head.t2d.zero_()[chosen] = True
    return head.prepare()


def deep_llama(layers: int = 4) -> nn.Module:
    """A random tiny Llama as test_static_target's ``build``, with enough layers for distinct aux layers."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**{**COMMON, "num_hidden_layers": layers}, tie_word_embeddings=False))
    return model.eval()


def test_aux_layers_are_clamped_into_range():
    assert eagle3_aux_layers(32) == (2, 16, 29)
    assert eagle3_aux_layers(4) == (2, 2, 1)
    assert eagle3_aux_layers(2) == (1, 1, 0)
    assert eagle3_aux_layers(1) == (0, 0, 0)


def reference_forward(head: Eagle3Head, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """cnets.py's midlayer written out with transformers' rotary helpers, causal, no cache: residual = the fused
    hidden; q/k/v over cat(input_layernorm(embed), hidden_norm(hidden)); pre-norm output."""
    layer, cfg = head.midlayer, head.config
    width, nh, kvh, d = embeds.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    norm = lambda x, m: m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps))
    if hidden.shape[-1] != HIDDEN:
        hidden = hidden @ head.fc.weight.T
    x = torch.cat([norm(embeds, layer.input_layernorm), norm(hidden, layer.hidden_norm)], dim=-1)  # (W, 2H)
    attn = layer.self_attn
    q = (x @ attn.q_proj.weight.T).view(width, nh, d).transpose(0, 1)  # (NH, W, D)
    k = (x @ attn.k_proj.weight.T).view(width, kvh, d).transpose(0, 1).repeat_interleave(nh // kvh, 0)
    v = (x @ attn.v_proj.weight.T).view(width, kvh, d).transpose(0, 1).repeat_interleave(nh // kvh, 0)
    config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=nh, max_position_embeddings=256)
    cos, sin = LlamaRotaryEmbedding(config)(x[None], torch.arange(width)[None])
    q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
    scores = (q[0] @ k[0].transpose(-1, -2)) / math.sqrt(d) + torch.full((width, width), -torch.inf).triu_(1)
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(width, nh * d) @ attn.o_proj.weight.T  # (W, H)
    h = hidden + out
    mlp = layer.mlp
    normed = norm(h, layer.post_attention_layernorm)
    return h + (nn.functional.silu(normed @ mlp.gate_proj.weight.T) * (normed @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T


def test_head_forward_matches_a_written_out_midlayer():
    head = random_head3()
    gen = torch.Generator().manual_seed(3)
    embeds, features = torch.randn(11, HIDDEN, generator=gen), torch.randn(11, 3 * HIDDEN, generator=gen)
    with torch.inference_mode():
        want = reference_forward(head, embeds, features)
        got = head(embeds, features, torch.arange(11), head.new_cache())
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        fused = features @ head.fc.weight.T  # (W, H): an H-wide feature is taken as the hidden as it is
        torch.testing.assert_close(head(embeds, fused, torch.arange(11), head.new_cache()), want, atol=1e-4, rtol=1e-5)


def test_chain_feeds_the_drafts_own_pre_norm_output_back():
    """The second chain token follows from a from-scratch forward whose last position reads the root's output
    (not fc of anything) as its hidden."""
    model = build("llama")
    target = HFTarget(model)
    head = random_head3(seed=6)
    proposer = Eagle3Proposer.from_options(target, head=head, num_speculative_tokens=2)
    prompt = random_prompt(9, 5)
    prefill = target.prefill(0, prompt)
    tokens = torch.cat([prompt, prefill.logits[-1:].argmax(-1)])
    proposer.begin_request(0, prompt)
    draft = proposer.propose({0: ProposerState(token_ids=tokens, hidden_states=prefill.aux_hidden_states)})[0]
    embed = model.get_input_embeddings()
    with torch.inference_mode():
        fused = prefill.aux_hidden_states @ head.fc.weight.T  # (T - 1, H)
        root = reference_forward(head, embed(tokens[1:]), fused)[-1]
        assert int(draft.tokens[0]) == int(head.logits(root[None])[0].argmax())
        path = torch.cat([tokens[1:], draft.tokens[:1]])
        second = reference_forward(head, embed(path), torch.cat([fused, root[None]]))[-1]
        assert int(draft.tokens[1]) == int(head.logits(second[None])[0].argmax())


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize(("fmt", "draft_vocab", "with_map"), [
    ("bin", VOCAB, True), ("bin", VOCAB, False), ("safetensors", DRAFT_VOCAB, True), ("bin", DRAFT_VOCAB, True),
], ids=["bin-equal-vocab", "bin-no-map", "safetensors-small-vocab", "bin-small-vocab"])
def test_checkpoint_layout_loads(tmp_path, fmt, draft_vocab, with_map):
    head = random_head3(draft_vocab=draft_vocab)
    out = save_eagle3_head(tmp_path / "head", head, format=fmt, with_vocab_map=with_map)
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == draft_vocab and "bias" not in config
    if fmt == "bin":
        state = torch.load(out / "pytorch_model.bin", weights_only=True)
        assert set(state) == set(expected_shapes3(head.config)) | ({"d2t", "t2d"} if with_map else set())
        assert all(tuple(state[k].shape) == s and state[k].dtype == torch.float32 for k, s in expected_shapes3(head.config).items())
        if with_map:
            assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
            assert state["t2d"].shape == (VOCAB,) and int(state["t2d"].sum()) == draft_vocab
    loaded = load_eagle3_head(out, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)
    assert loaded.config == head.config and (loaded.d2t is None) is (not with_map)
    assert torch.equal(loaded.draft_to_target(), head.draft_to_target())
    want, got = head.state_dict(), loaded.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in got)
    gen = torch.Generator().manual_seed(0)
    embeds, features = torch.randn(7, HIDDEN, generator=gen), torch.randn(7, 3 * HIDDEN, generator=gen)
    positions = torch.arange(7)
    torch.testing.assert_close(loaded(embeds, features, positions, loaded.new_cache()),
                               head(embeds, features, positions, head.new_cache()), atol=0, rtol=0)


def shift_d2t(state) -> None:
    state["d2t"][-1] += VOCAB  # the last draft id now maps beyond the target's vocabulary


MALFORMED = {  # variant -> (edit, what the message must say besides the file)
    "missing-key": (lambda s: s.pop("midlayer.hidden_norm.weight"), "'midlayer.hidden_norm.weight' is missing"),
    "unexpected-key": (put("midlayer.extra.weight", torch.zeros(3)), "unexpected key 'midlayer.extra.weight'"),
    "own-embedding": (put("embed_tokens.weight", torch.zeros(VOCAB, HIDDEN)), "unexpected key 'embed_tokens.weight'"),
    "fc-2h": (put("fc.weight", torch.zeros(HIDDEN, 2 * HIDDEN)), "'fc.weight' has shape (64, 128), expected (64, 192)"),
    "q-proj-h": (put("midlayer.self_attn.q_proj.weight", torch.zeros(64, HIDDEN)),
                 "'midlayer.self_attn.q_proj.weight' has shape (64, 64), expected (64, 128)"),
    "lm-head-vocab": (put("lm_head.weight", torch.zeros(VOCAB, HIDDEN)), "'lm_head.weight' has shape (256, 64), expected (96, 64)"),
    "d2t-out-of-range": (shift_d2t, "key 'd2t' maps draft id 95 to target id"),
    "d2t-dtype": (lambda s: s.update(d2t=s["d2t"].int()), "key 'd2t' holds a torch.int32 tensor"),
    "d2t-missing": (lambda s: (s.pop("d2t"), s.pop("t2d")), "key 'd2t' is missing"),
    "t2d-disagrees": (lambda s: s["t2d"].__setitem__(s["t2d"].nonzero()[0], False), "key 't2d' marks 95 target ids"),
    "nan": (poison("midlayer.mlp.down_proj.weight"), "'midlayer.mlp.down_proj.weight' holds 1 non-finite"),
    "inf-norm": (lambda s: s["norm.weight"].__setitem__(3, math.inf), "'norm.weight' holds 1 non-finite"),
}


@pytest.mark.parametrize("variant", sorted(MALFORMED))
def test_malformed_weights_name_file_and_key(tmp_path, variant):
    edit, message = MALFORMED[variant]
    out = save_eagle3_head(tmp_path / "head", random_head3(draft_vocab=DRAFT_VOCAB))
    rewrite_weights(out, edit)
    assert_refused(Eagle3CheckpointError, load_eagle3_head, out, "pytorch_model.bin", message)


HEADS = {  # kind -> (a random head, its writer, its loader, the loader's one refusal class)
    "eagle": (random_head, save_eagle_head, load_eagle_head, EagleCheckpointError),
    "eagle3": (random_head3, save_eagle3_head, load_eagle3_head, Eagle3CheckpointError),
}


@pytest.mark.parametrize("kind", sorted(HEADS))
@pytest.mark.parametrize(("hidden", "vocab", "message"), [
    (2 * HIDDEN, VOCAB, f"hidden_size = {HIDDEN}, but the target's is {2 * HIDDEN}"),
    (HIDDEN, 2 * VOCAB, f"vocab_size = {VOCAB}, but the target's is {2 * VOCAB}"),
])
def test_target_size_mismatch_names_both_sizes(tmp_path, kind, hidden, vocab, message):
    """Either loader refuses a head trained for another target, naming its config.json and both sizes."""
    make, save, load, error = HEADS[kind]
    out = save(tmp_path / "head", make())
    assert_refused(error, load, out, "config.json", message, target_hidden_size=hidden, target_vocab_size=vocab)


def test_config_errors_name_the_field(tmp_path):
    out = save_eagle3_head(tmp_path / "head", random_head3())
    config = json.loads((out / "config.json").read_text())
    for edit, message in (({"num_hidden_layers": 2}, "num_hidden_layers = 2"),
                          ({"draft_vocab_size": 2 * VOCAB}, "draft_vocab_size = 512 exceeds vocab_size = 256"),
                          ({"intermediate_size": None}, "'intermediate_size'")):
        (out / "config.json").write_text(json.dumps({**config, **edit}))
        with pytest.raises(Eagle3CheckpointError, match=message) as error:
            load_eagle3_head(out, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)
        assert str(out / "config.json") in str(error.value)


def test_an_eagle1_loader_refuses_eagle3_and_back(tmp_path):
    out = save_eagle3_head(tmp_path / "head", random_head3())
    with pytest.raises(EagleCheckpointError, match="EAGLE-3"):
        load_eagle_head(out, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)


# ---------------------------------------------------------------- lossless decoding


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_greedy_eagle3_matches_plain_decoding(tmp_path, engine, mode):
    model = deep_llama()
    target = HFTarget(model) if engine == "eager" else StaticTarget.from_hf_model(model)
    if mode == "chain":  # through a checkpoint path, with a draft vocabulary smaller than the target's
        path = save_eagle3_head(tmp_path / "head", random_head3(draft_vocab=DRAFT_VOCAB), format="safetensors")
        proposer = create_proposer("eagle3", target, path=str(path), **MODES[mode])
    else:
        proposer = create_proposer("eagle3", target, head=random_head3(), **MODES[mode])
    assert isinstance(proposer, Eagle3Proposer) and target.aux_layers == (2, 2, 1)
    assert sum(result.counters.num_drafts for result in decode_losslessly(model, target, proposer)) > 0


def test_two_layer_target_and_first_step_reads_fc_of_aux_features():
    """On a 2-layer target the aux layers clip to (1, 1, 0); the root's output is a from-scratch forward over the
    (T - 1, 3H) aux features."""
    model = build("llama")
    target = HFTarget(model)
    head = random_head3()
    proposer = Eagle3Proposer.from_options(target, head=head, num_speculative_tokens=2)
    assert target.aux_layers == (1, 1, 0)
    prompt = random_prompt(10, 2)
    prefill = target.prefill(0, prompt)
    assert prefill.aux_hidden_states.shape == (10, 3 * HIDDEN)
    tokens = torch.cat([prompt, prefill.logits[-1:].argmax(-1)])
    proposer.begin_request(0, prompt)
    root = proposer._catch_up({0: ProposerState(token_ids=tokens, hidden_states=prefill.aux_hidden_states)})[0][0]
    embed = model.get_input_embeddings()
    with torch.inference_mode():
        want = head(embed(tokens[1:]), prefill.aux_hidden_states, torch.arange(10), head.new_cache())[-1]
    torch.testing.assert_close(root, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_d2t_maps_drafts_into_the_t2d_set(mode):
    model = build("llama")
    target = HFTarget(model)
    head = random_head3(seed=4, draft_vocab=DRAFT_VOCAB)
    proposer = Eagle3Proposer.from_options(target, head=head, **MODES[mode])
    allowed = set(head.t2d.nonzero().flatten().tolist())
    assert len(allowed) == DRAFT_VOCAB and allowed != set(range(DRAFT_VOCAB))
    prompt = random_prompt(12, 3)
    prefill = target.prefill(0, prompt)
    tokens = torch.cat([prompt, prefill.logits[-1:].argmax(-1)])
    proposer.begin_request(0, prompt)
    draft = proposer.propose({0: ProposerState(token_ids=tokens, hidden_states=prefill.aux_hidden_states)})[0]
    assert set(draft.tokens.tolist()) <= allowed
    with torch.inference_mode():  # the first token is the target id of the draft argmax
        root = proposer._catch_up({0: ProposerState(token_ids=tokens, hidden_states=prefill.aux_hidden_states)})[0][0]
        best = int(head.logits(root[None])[0].argmax())
    first = int(draft.tokens[0]) if mode == "chain" else None
    if first is not None:
        assert first == best + int(head.d2t[best])


def test_option_errors():
    target = HFTarget(build("llama"))
    head = random_head3(draft_vocab=DRAFT_VOCAB)
    for options, message in (
        ({}, "exactly one of num_speculative_tokens"),
        ({"top_k": DRAFT_VOCAB + 1, "depth": 2, "total_tokens": 4}, f"exceeds the vocabulary of {DRAFT_VOCAB}"),
        ({"num_speculative_tokens": 0}, "must be an integer >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            Eagle3Proposer.from_options(target, head=head, **options)
    with pytest.raises(ValueError, match="exactly one of head"):
        Eagle3Proposer.from_options(target, num_speculative_tokens=2)
    assert target.aux_layers == ()  # refused options leave the target as it was
