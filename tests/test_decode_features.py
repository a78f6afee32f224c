"""The decode loop hands feature-reading proposers (EAGLE) the target's hidden state at every position."""

from __future__ import annotations

import pytest
import torch

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.engine.static_target import StaticTarget
from specbench.engine.step_inputs import SlotInput
from specbench.proposers.scripted import ScriptedProposer
from test_static_target import build
from _prompts import random_prompt

MAX_NEW = 20


class FeatureRecorder(ScriptedProposer):
    """The scripted oracle (wrong at chosen positions), recording every state's tokens and hidden states."""

    needs_hidden_states = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def propose(self, state):
        self.seen.append((state.token_ids.clone(), state.hidden_states.clone()))
        return super().propose(state)


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_hidden_states_row_i_is_the_state_that_predicted_token_i_plus_1(engine):
    """After steps that accept all, some or none of the draft, row i must equal a fresh full forward's
    final hidden state at position i, for every i below the last token (fp32, tolerance as the static
    target's own logits test: summation order only)."""
    model = build("llama")
    target = HFTarget(model) if engine == "eager" else StaticTarget.from_hf_model(model)
    prompt = random_prompt(12, 1)
    truth = Decoder(target, None, GenerationConfig(max_new_tokens=MAX_NEW + 8)).generate(prompt).output_token_ids
    proposer = FeatureRecorder(truth, 3, target.vocab_size, wrong_positions={4, 9, 10})
    result = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompt)
    assert result.output_token_ids == truth[:MAX_NEW]
    assert len(proposer.seen) == result.counters.num_drafts > 3
    for tokens, features in proposer.seen:
        assert features.shape == (tokens.numel() - 1, model.config.hidden_size)
        with torch.inference_mode():
            full = model.model(tokens[None]).last_hidden_state[0]  # (T, H)
        torch.testing.assert_close(features, full[:-1], atol=1e-4, rtol=0)


def test_proposers_that_do_not_ask_get_no_hidden_states():
    model = build("llama")
    target = HFTarget(model)
    prompt = random_prompt(8, 2)
    seen = []

    class Plain(ScriptedProposer):
        def propose(self, state):
            seen.append(state.hidden_states)
            return super().propose(state)

    Decoder(target, Plain([1] * 30, 2, target.vocab_size), GenerationConfig(max_new_tokens=6)).generate(prompt)
    assert seen and all(h is None for h in seen)


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_aux_layers_return_what_enters_those_layers_and_become_the_features(engine):
    """EAGLE-3 reads the residual streams entering layers (2, L // 2, L - 3): both targets must return what
    transformers' output_hidden_states gives there (hidden_states[i] enters layer i), at prefill and verify,
    and the decode loop must hand those (not the final states) to a feature-reading proposer."""
    model = build("llama")  # 2 layers: aux layers 0 and 1
    target = HFTarget(model) if engine == "eager" else StaticTarget.from_hf_model(model)
    target.set_aux_layers((1, 0))
    ids = random_prompt(14, 4)
    with torch.inference_mode():
        states = model.model(ids[None], output_hidden_states=True).hidden_states
    want = torch.cat([states[1][0], states[0][0]], dim=-1)  # (14, 2H)
    target.reserve(32, 3)  # slot 0 sized for chains of 3 draft nodes: the chain below fills the width (eager: no-op)
    prefill = target.prefill(0, ids[:10])
    torch.testing.assert_close(prefill.aux_hidden_states, want[:10], atol=1e-4, rtol=0)
    chain = target.verify([SlotInput(ids[10:], list(range(4)))])
    torch.testing.assert_close(chain.aux_hidden_states[0], want[10:], atol=1e-4, rtol=0)
    target.commit([[0, 1, 2, 3]])

    truth = Decoder(target, None, GenerationConfig(max_new_tokens=MAX_NEW + 8)).generate(ids).output_token_ids
    proposer = FeatureRecorder(truth, 3, target.vocab_size, wrong_positions={3, 7})
    Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW)).generate(ids)
    tokens, features = proposer.seen[-1]
    with torch.inference_mode():
        states = model.model(tokens[None], output_hidden_states=True).hidden_states
    torch.testing.assert_close(features, torch.cat([states[1][0], states[0][0]], dim=-1)[:-1], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=r"aux layers \[5\] out of range: the target has 2 layers"):
        target.set_aux_layers((5,))
