"""A step attends over its longest slot's entries rounded up to a span (engine/static_cache.attention_span),
not the whole cache: the spans' ladder, the same logits as over the whole cache, every span's graph captured before a
run (prepare_steps) and writing one shared set of outputs."""

from __future__ import annotations

import pytest
import torch

from _prompts import random_prompt
from specbench.engine import static_target as static_module
from specbench.engine.static_cache import attention_span, attention_spans
from specbench.engine.static_target import StaticTarget
from specbench.engine.step_inputs import SlotInput
from test_batched_engine import tiny_llama_model
from test_batched_graphs import FakeCapture


@pytest.mark.parametrize("needed, capacity, span", [
    (1, 259, 32), (32, 259, 32), (33, 259, 64), (129, 259, 160), (161, 259, 192), (256, 259, 256), (257, 259, 259),
    (300, 259, 259), (1025, 4096, 1280), (3000, 4096, 3072), (4096, 4096, 4096),
])
def test_the_span_is_the_need_rounded_up_to_a_quarter_octave(needed, capacity, span):
    assert attention_span(needed, capacity) == span


@pytest.mark.parametrize("shortest, capacity", [(1, 259), (129, 259), (5, 4096), (100, 100)])
def test_the_spans_cover_every_need_up_to_the_capacity(shortest, capacity):
    spans = attention_spans(shortest, capacity)
    assert spans == sorted(set(spans)) and spans[-1] == capacity
    assert {attention_span(n, capacity) for n in range(shortest, capacity + 1)} == set(spans)
    for needed in range(shortest, capacity + 1):  # dead entries beyond the need: under a quarter of it, or 32
        assert 0 <= attention_span(needed, capacity) - needed <= max(31, needed // 4)
    assert len(attention_spans(1, 4096)) == 24  # four per octave from 128 up: few graphs for a long cache


@pytest.fixture(scope="module")
def static():
    return StaticTarget.from_hf_model(tiny_llama_model())


def prefilled(static, batch: int = 2, capacity: int = 200, **options) -> StaticTarget:
    target = static.with_batch_size(batch, **options)
    target.reserve(capacity, 3)
    for slot in range(batch):
        target.prefill(slot, random_prompt(9 + 20 * slot, slot))
    return target


TREE = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)  # root, a, b, a's child
STEPS = {  # (the step's inputs, slots truncated back first)
    "chain": ([SlotInput(torch.tensor([3, 4, 5, 6]), torch.arange(4)), SlotInput(torch.tensor([7, 8]), torch.arange(2))],
              {}),
    "tree, an idle slot": ([None, SlotInput(torch.tensor([3, 4, 5, 6]), torch.tensor([0, 1, 1, 2]), TREE)], {}),
    "after truncate": ([SlotInput(torch.tensor([5]), torch.zeros(1, dtype=torch.long)),
                        SlotInput(torch.tensor([6, 7, 8]), torch.arange(3))], {1: 12}),
}


@pytest.mark.parametrize("label", list(STEPS))
def test_a_step_over_its_span_scores_as_over_the_whole_cache(static, monkeypatch, label):
    inputs, truncate = STEPS[label]

    def scored():
        target = prefilled(static)  # slots of 9 and 29 entries: the chain's span is 64 of 200
        if truncate:
            target.truncate(truncate)
        out = target.verify(inputs)
        return out, [n for x, n in zip(inputs, range(2)) if x is not None]

    spanned, live = scored()
    monkeypatch.setattr(static_module, "attention_span", lambda needed, capacity: capacity)
    whole, _ = scored()
    for slot in live:  # every real node's scores, idle and padded rows aside
        n = len(inputs[slot])
        torch.testing.assert_close(spanned.logits[slot, :n], whole.logits[slot, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(spanned.hidden_states[slot, :n], whole.hidden_states[slot, :n], rtol=1e-5, atol=1e-5)
        assert spanned.logits[slot, :n].argmax(-1).tolist() == whole.logits[slot, :n].argmax(-1).tolist()


def test_prepare_steps_captures_every_span_once_and_the_spans_share_their_outputs(static):
    target = prefilled(static, cuda_graphs=True, graph_backend=FakeCapture())
    target.prepare_steps(9, kinds=("plain", "chain"))
    captured = target.graphs.captures
    assert set(captured) == {(kind, width, span) for kind, width in (("plain", 1), ("chain", 4))
                             for span in attention_spans(9 + width, 200)} and set(captured.values()) == {1}
    step = [SlotInput(torch.tensor([3, 4, 5, 6]), torch.arange(4)), None]
    target.verify(step)
    target.commit([[0, 1, 2, 3], None])
    assert target.graphs.captures == captured  # nothing new: the run replays what was prepared
    shared = target._buffers[("chain", 4)].outputs  # every span's graph writes the same static outputs
    spans = [step for key, step in target.graphs.captured.items() if key[:2] == ("chain", 4)]
    assert len(spans) > 1 and all(step.outputs[0] is shared[0] and step.outputs[1] is shared[1] for step in spans)
    target.prepare_steps(9)  # a no-op for what is captured; the tree kind now too
    assert {key[0] for key in target.graphs.captures} == {"plain", "chain", "tree"}


def test_prepare_steps_refuses_without_a_cache_mid_step_or_without_room(static):
    with pytest.raises(ValueError, match="prepare_steps before reserve"):
        static.with_batch_size(1).prepare_steps()
    target = prefilled(static, capacity=40, cuda_graphs=True, graph_backend=FakeCapture())
    target.verify([SlotInput(torch.tensor([3]), torch.zeros(1, dtype=torch.long)), None])
    with pytest.raises(ValueError, match="between a verify and its commit"):
        target.prepare_steps()
    target.commit([[0], None])
    target.prefill(1, random_prompt(39, 7))  # 39 of 40 entries: no room for a chain step's 4
    with pytest.raises(ValueError, match="needs 4 free entries beyond every slot's committed ones"):
        target.prepare_steps()
