"""Group prefill (engine/group_prefill.py): n prompts of mixed lengths prefilled in one forward leave each slot's
cache and outputs as its own one-slot prefill does, touch no other slot, split at the token budget; the decode loop
admits every free slot in one group and reports its decode phase apart from its admissions. A fused group prefill
(fused_prefill) compiles before the clock, once, and leaves the slots as the eager one. (One prompt's prefill through
a graph per padded width: tests/test_static_prefill_graphs.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from _prompts import random_prompt
from specbench.compile_watch import compiled_graphs
from specbench.engine import group_prefill
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.group_prefill import split_group
from specbench.engine.static_target import StaticTarget
from test_batched_engine import tiny_llama_model

PROMPTS = [random_prompt(9, 1), random_prompt(3, 2), random_prompt(17, 3)]


@pytest.fixture(scope="module")
def static():
    return StaticTarget.from_hf_model(tiny_llama_model())


def batched(static, batch_size: int = 4) -> StaticTarget:
    target = static.with_batch_size(batch_size)
    target.reserve(32)
    return target


@pytest.mark.parametrize("budget", [8192, 20])  # one forward; then groups of at most 20 padded tokens (3 forwards)
def test_a_group_prefill_leaves_each_slot_as_its_own_prefill_does(static, budget):
    alone, group = batched(static), batched(static)
    marker = torch.full_like(group._cache.kv[:, :, 1], 7.0)  # slot 1 holds something a group must not touch
    group._cache.kv[:, :, 1] = marker
    group.prefill_token_budget = budget
    outs = group.prefill_many([3, 0, 2], PROMPTS)
    for slot, prompt, out in zip([3, 0, 2], PROMPTS, outs):
        want = alone.prefill(slot, prompt)
        n = prompt.numel()
        assert group.cache_length(slot) == n and int(group._cache.lengths[slot]) == n
        # fp32, different matmul shapes: equal to rounding (the decoder's exactness is asserted on tokens below)
        torch.testing.assert_close(group._cache.kv[:, :, slot, :, :n], alone._cache.kv[:, :, slot, :, :n])
        torch.testing.assert_close(out.hidden_states, want.hidden_states)
        torch.testing.assert_close(out.logits, want.logits)
        assert out.logits.argmax(-1).tolist() == want.logits.argmax(-1).tolist()
    assert torch.equal(group._cache.kv[:, :, 1], marker) and group.cache_length(1) == 0


def test_a_fused_group_prefill_compiles_before_the_clock_and_leaves_the_slots_as_the_eager_one(static, monkeypatch):
    """fused_prefill: the stages compiled in caches of their own at two warm-up sizes (prepare_prefills, once); an
    admission of another size compiles nothing, and each slot holds what the eager group prefill leaves (fp32:
    equal to rounding)."""
    torch._dynamo.reset()  # the compiled stages are process-wide: start from none, whatever ran before
    fused = static.with_batch_size(4, fused_prefill=True)
    fused.reserve(32)
    eager = batched(static)
    fused.prepare_prefills([p.numel() for p in PROMPTS])
    assert [fused.cache_length(slot) for slot in range(4)] == [0, 0, 0, 0]  # the warm-up's slots are emptied
    forwards = []
    monkeypatch.setattr(group_prefill, "prefill_group", lambda *a, **k: forwards.append(a))
    fused.prepare_prefills([p.numel() for p in PROMPTS])
    assert forwards == []  # prepared once: a second run's preparation runs no forward
    monkeypatch.undo()
    before = compiled_graphs()
    # 3 x 17 padded tokens (the second warm-up's size, tuned there), then 2 x 9 (a size no warm-up had)
    for slots, prompts in (([3, 0, 2], PROMPTS), ([1, 2], PROMPTS[:2])):
        for target in (fused, eager):
            for slot in slots:
                target.release(slot)
        got, want = fused.prefill_many(slots, prompts), eager.prefill_many(slots, prompts)
        assert compiled_graphs() == before, "an admission compiled: the warm-up left the token count static"
        for slot, prompt, g, w in zip(slots, prompts, got, want):
            n = prompt.numel()
            torch.testing.assert_close(g.logits, w.logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(g.hidden_states, w.hidden_states, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(fused._cache.kv[:, :, slot, :, :n], eager._cache.kv[:, :, slot, :, :n],
                                       rtol=1e-5, atol=1e-5)
            assert fused.cache_length(slot) == n


def test_preparing_a_fused_prefill_refuses_slots_in_use(static):
    fused = static.with_batch_size(4, fused_prefill=True)
    fused.reserve(32)
    fused.prefill(1, PROMPTS[1])
    with pytest.raises(ValueError, match=r"writes slots 0..2, but slots \[1\] hold requests; prepare before a run"):
        fused.prepare_prefills([p.numel() for p in PROMPTS])
    assert fused.cache_length(1) == PROMPTS[1].numel()


def test_a_cache_without_a_slot_dimension_is_refused(static):
    """The model writes a cache of B slots ``(L, 2, B, KVH, S, D)``: one without the slot dimension is refused by its
    shape, before anything is written."""
    layers, kv_heads, head_dim = static.module.shape.num_layers, static.module.shape.num_kv_heads, static.module.shape.head_dim
    cache = torch.zeros(layers, 2, kv_heads, 16, head_dim)  # (L, 2, KVH, S, D)
    ids = PROMPTS[0][:4]
    with pytest.raises(ValueError, match=r"cache is \(layers, 2, B, kv_heads, S, head_dim\); got shape \(2, 2, 2, 16, 16\)"):
        static.module(ids, torch.arange(4), torch.arange(1), None, cache)
    assert not cache.any()


def test_the_token_budget_splits_groups_by_count_times_longest():
    assert split_group([4, 4, 4, 4], 16) == [[0, 1, 2, 3]]
    assert split_group([4, 4, 9, 4], 16) == [[0, 1], [2], [3]]  # 3 x 9 > 16; a 9 and a 4 pad to 18 > 16
    assert split_group([30, 2], 16) == [[0], [1]]  # longer than the budget: alone
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        split_group([3], 0)


def test_a_group_prefill_refuses_repeated_slots_and_prompts_that_do_not_fit(static):
    target = batched(static)
    with pytest.raises(ValueError, match=r"distinct slots, one per prompt; got slots \[0, 0\]"):
        target.prefill_many([0, 0], PROMPTS[:2])
    with pytest.raises(ValueError, match="a prompt of 40 tokens does not fit a slot of 32 cache entries"):
        target.prefill_many([0, 1], [PROMPTS[0], random_prompt(40, 5)])


class _CountingTarget(StaticTarget):
    """Records each prefill_many call's slots."""

    calls: list

    def prefill_many(self, slots, prompts):
        self.calls.append(list(slots))
        return super().prefill_many(slots, prompts)


def test_the_decode_loop_admits_every_free_slot_in_one_group_and_times_its_phases(static):
    target = _CountingTarget(static.module, static.config, 3, max_context=static.max_context)
    target.calls = []
    prompts = PROMPTS + [random_prompt(5, 6), random_prompt(11, 7)]
    config = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    decoder = Decoder(target, None, config)
    results = decoder.generate_all(prompts)
    # all three slots at the start in one group; the three requests end together, two prompts are left
    assert target.calls == [[0, 1, 2], [0, 1]]
    stats = decoder.stats
    assert stats.num_admissions == 5 and stats.num_refills == 2
    assert stats.step_tokens + stats.num_admissions == sum(r.timing.num_output_tokens for r in results) == 30
    assert stats.step_s > 0 and stats.admission_s > 0
    assert math.isclose(stats.decode_throughput_tokens_per_s, stats.step_tokens / stats.step_s)
    first = [r for r in results if r.queue_s < results[3].queue_s]  # the requests of the first group share its TTFT
    assert len(first) == 3 and len({r.timing.time_to_first_token_s for r in first}) == 1
