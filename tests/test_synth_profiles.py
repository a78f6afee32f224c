"""`specbench zoo synth` shapes and profile heads: the 1b shape, medusa-profile/ loading through the normal
Medusa loader, each head's top-1 accuracy as requested, and a chain's acceptance as the profile predicts."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers import LlamaConfig

from specbench.checkpoints.medusa import MedusaCheckpointWarning
from specbench.checkpoints.resolve import load_target_model
from specbench.cli import main
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.medusa.checkpoint import load_medusa_heads
from specbench.proposers.medusa import MedusaProposer
from specbench.zoo.synth import MEDUSA_1_VICUNA_7B_TOP1, NUM_SPECIAL_TOKENS, SHAPES, head_accuracies

VOCAB, HIDDEN = 512, 64  # the tiny shape
NUM_ORDINARY = VOCAB - NUM_SPECIAL_TOKENS
PROMPT = torch.tensor([5, 17, 200, 33, 101, 7])


def _synth(directory, *extra: str):
    assert main(["zoo", "synth", str(directory), "--tiny", "--device", "cpu", *extra]) == 0
    return json.loads((directory / "synth_record.json").read_text())


@pytest.fixture(scope="module")
def default_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("synth-default")
    _synth(directory)
    return directory


@pytest.fixture(scope="module")
def target_model(default_dir):
    return load_target_model(str(default_dir / "target"), dtype=torch.bfloat16, device="cpu")


def _load_profile(directory, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MedusaCheckpointWarning)  # config.json claims 2 heads, as published
        return load_medusa_heads(directory / "medusa-profile", hidden_size=HIDDEN, vocab_size=VOCAB, **kwargs)


def test_the_1b_shape_is_llama_3_2_1b_like_with_gqa():
    shape = SHAPES["1b"]
    assert shape == dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048,
                         rms_norm_eps=1e-5)
    config = LlamaConfig(**shape, tie_word_embeddings=False)
    assert config.num_key_value_heads < config.num_attention_heads  # GQA: 4 query heads share a key/value head
    assert config.head_dim * config.num_attention_heads == config.hidden_size and not config.tie_word_embeddings


def test_record_names_the_shape_and_the_profile(default_dir):
    record = json.loads((default_dir / "synth_record.json").read_text())
    assert record["shape_name"] == "tiny" and record["shape"]["hidden_size"] == HIDDEN
    assert record["medusa_profile"] == str(default_dir / "medusa-profile")
    assert record["head_accuracy"] == list(MEDUSA_1_VICUNA_7B_TOP1)
    built = record["head_top1_accuracy"]
    assert record["expected_per_position_acceptance"][:2] == pytest.approx([built[0], built[0] * built[1]])
    assert head_accuracies([0.9, 0.5], 4) == [0.9, 0.5, 0.5, 0.5]  # the last entry repeats


def test_profile_heads_load_through_the_medusa_loader(default_dir):
    config = json.loads((default_dir / "medusa-profile" / "config.json").read_text())
    assert config == json.loads((default_dir / "medusa" / "config.json").read_text())  # the upstream config
    heads = _load_profile(default_dir)
    assert heads.config.num_heads == 5 and heads.lm_heads is not None
    for block in heads.blocks:  # identity residual blocks: x + SiLU(0 x + 0) = x
        assert not block[0].linear.weight.any() and not block[0].linear.bias.any()


def _successor(model) -> torch.Tensor:
    """(V,) the target's own greedy successor of each token, from its single-token hidden state."""
    with torch.no_grad():
        return model.lm_head(model.model(torch.arange(VOCAB)[:, None]).last_hidden_state[:, 0]).argmax(-1)


def _head_logits(heads, model, tokens: torch.Tensor) -> torch.Tensor:
    """(heads, T, V) logits from each token's single-token final hidden state (what Medusa sees)."""
    with torch.no_grad():
        hidden = model.model(tokens[:, None]).last_hidden_state[:, 0]  # (T, H), final-normed
        return heads.float()(hidden.float())


def test_each_head_is_right_for_the_requested_fraction_of_tokens(default_dir, target_model):
    """Over all ordinary tokens, from the target's own final hidden state for each single token. The construction
    makes exactly round((1 - p) * N) tokens wrong, so measured and requested differ by rounding, <= 0.5 / N (0.001);
    it is exact only while the margins hold, which the top1 - top2 check shows (sqrt(64) = 8 against N(0, 1) noise)."""
    tokens = torch.arange(NUM_SPECIAL_TOKENS, VOCAB)  # (N,)
    successor = _successor(target_model)  # (V,)
    logits = _head_logits(_load_profile(default_dir), target_model, tokens)  # (heads, N, V)
    record = json.loads((default_dir / "synth_record.json").read_text())
    truth = successor[tokens]  # (N,): succ^1
    for h, requested in enumerate(MEDUSA_1_VICUNA_7B_TOP1):
        truth = successor[truth]  # succ^(h + 2)
        top2 = logits[h].topk(2, dim=-1)
        measured = (top2.indices[:, 0] == truth).float().mean().item()
        assert abs(measured - requested) <= 0.5 / NUM_ORDINARY + 1e-6, (h, measured, requested)
        assert measured == pytest.approx(record["head_top1_accuracy"][h], abs=1e-6)
        assert float((top2.values[:, 0] - top2.values[:, 1]).min()) > 2.0  # no near-tie decides a top-1


def test_chain_acceptance_follows_the_profile_token_by_token(default_dir, target_model):
    """Each step, the draft's accepted length is the number of leading heads right for the step's hidden token
    (the last accepted one), so the run's counters are predicted exactly from the single-token top-1 table."""
    target = HFTarget(target_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MedusaCheckpointWarning)
        proposer = MedusaProposer.from_options(target, path=str(default_dir / "medusa-profile"), num_speculative_tokens=3)
    config = GenerationConfig(max_new_tokens=120, ignore_eos=True)
    result = Decoder(target, proposer, config).generate(PROMPT)
    plain = Decoder(target, None, config).generate(PROMPT).output_token_ids
    assert result.output_token_ids == plain
    text = torch.tensor(PROMPT.tolist() + plain)
    drafts = _head_logits(_load_profile(default_dir, num_heads=3), target_model, text).argmax(-1)  # (3, T)
    successor = _successor(target_model)
    ahead, right = successor[text], []  # right[h][i]: head h's top-1 from text[i] is succ^(h + 2)(text[i])
    for h in range(3):
        ahead = successor[ahead]
        right.append((drafts[h] == ahead).tolist())
    position, emitted, accepted = len(PROMPT) - 1, 1, 0  # the prefill emits the first token
    while emitted < config.max_new_tokens:
        step = next((h for h in range(3) if not right[h][position]), 3)
        accepted, emitted, position = accepted + step, emitted + step + 1, position + step + 1
    assert result.counters.num_accepted_tokens == accepted
    assert 0 < accepted < result.counters.num_draft_tokens  # neither all nor none: the profile shows


def test_accuracy_one_gives_full_acceptance(tmp_path):
    record = _synth(tmp_path, "--head-accuracy", "1.0")
    assert record["head_top1_accuracy"] == [1.0] * 5
    target = HFTarget(load_target_model(str(tmp_path / "target"), dtype=torch.bfloat16, device="cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MedusaCheckpointWarning)
        proposer = MedusaProposer.from_options(target, path=str(tmp_path / "medusa-profile"), num_speculative_tokens=3)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    result = Decoder(target, proposer, config).generate(PROMPT)
    assert result.counters.acceptance_rate == 1.0 and result.counters.num_drafts > 0
    assert result.output_token_ids == Decoder(target, None, config).generate(PROMPT).output_token_ids


@pytest.mark.parametrize("value", ["1.5", "abc", "0.5,,0.2", "nan"])
def test_a_bad_head_accuracy_exits_2_naming_flag_and_value(tmp_path, capsys, value):
    assert main(["zoo", "synth", str(tmp_path), "--tiny", "--device", "cpu", "--head-accuracy", value]) == 2  # usage error
    err = capsys.readouterr().err
    assert "--head-accuracy" in err and repr(value) in err
    assert not (tmp_path / "target").exists()


def test_more_accuracies_than_heads_is_refused_before_writing(tmp_path, capsys):
    assert main(["zoo", "synth", str(tmp_path), "--tiny", "--device", "cpu", "--num-medusa-heads", "2",
                 "--head-accuracy", "0.5,0.4,0.3"]) == 2
    assert "--head-accuracy" in capsys.readouterr().err and not (tmp_path / "target").exists()
