"""Group prefill (engine/batched_prefill.py): n prompts of mixed lengths prefilled in one forward leave each slot's
cache and outputs as its own one-slot prefill does, touch no other slot, split at the token budget; the batched loop
admits every free slot in one group and reports its decode phase apart from its admissions. One prompt's prefill
through a graph per padded width (engine/prefill_graphs.py, the CPU stand-in of a CUDA graph) leaves the slot as the
eager prefill does, captures once per bucket, falls back to eager when the bucket exceeds the cache. A fused group
prefill (fused_prefill) compiles before the clock, once, and leaves the slots as the eager one."""

from __future__ import annotations

import math

import pytest
import torch

from _prompts import random_prompt
from specbench.compile_watch import compiled_graphs
from specbench.engine.batched_decode import BatchedDecoder
from specbench.engine import batched_prefill
from specbench.engine.batched_prefill import split_group
from specbench.engine.batched_target import BatchedStaticTarget
from specbench.engine.decode import GenerationConfig
from specbench.engine.graph_capture import StepGraphs
from specbench.engine.prefill_graphs import CapturedPrefill, bucket
from specbench.engine.static_target import StaticTarget
from test_batched_engine import tiny_llama_model
from test_batched_graphs import FakeCapture

PROMPTS = [random_prompt(9, 1), random_prompt(3, 2), random_prompt(17, 3)]


@pytest.fixture(scope="module")
def static():
    return StaticTarget.from_hf_model(tiny_llama_model())


def batched(static, batch_size: int = 4) -> BatchedStaticTarget:
    target = BatchedStaticTarget.from_static_target(static, batch_size)
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
    fused = BatchedStaticTarget.from_static_target(static, 4, fused_prefill=True)
    fused.reserve(32)
    eager = batched(static)
    fused.prepare_prefills([p.numel() for p in PROMPTS])
    assert [fused.cache_length(slot) for slot in range(4)] == [0, 0, 0, 0]  # the warm-up's slots are emptied
    forwards = []
    monkeypatch.setattr(batched_prefill, "prefill_group", lambda *a, **k: forwards.append(a))
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
    fused = BatchedStaticTarget.from_static_target(static, 4, fused_prefill=True)
    fused.reserve(32)
    fused.prefill(1, PROMPTS[1])
    with pytest.raises(ValueError, match=r"writes slots 0..2, but slots \[1\] hold requests; prepare before a run"):
        fused.prepare_prefills([p.numel() for p in PROMPTS])
    assert fused.cache_length(1) == PROMPTS[1].numel()


def test_a_forward_without_a_mask_refuses_a_single_sequence_cache(static):
    """No mask means a group prefill, which writes a batched cache: a one-sequence cache is refused by name, before
    anything is written."""
    layers, kv_heads, head_dim = static.module.shape.num_layers, static.module.shape.num_kv_heads, static.module.shape.head_dim
    cache = torch.zeros(layers, 2, kv_heads, 16, head_dim)  # (L, 2, KVH, S, D)
    ids = PROMPTS[0][:4]
    with pytest.raises(ValueError, match=r"group prefill, which writes a batched cache .*has shape \(2, 2, 16, 16\)"):
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


class _CountingTarget(BatchedStaticTarget):
    """Records each prefill_many call's slots."""

    calls: list

    def prefill_many(self, slots, prompts):
        self.calls.append(list(slots))
        return super().prefill_many(slots, prompts)


def test_the_batched_loop_admits_every_free_slot_in_one_group_and_times_its_phases(static):
    target = _CountingTarget.from_static_target(static, 3)
    target.calls = []
    prompts = PROMPTS + [random_prompt(5, 6), random_prompt(11, 7)]
    config = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    decoder = BatchedDecoder(target, None, config)
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


# --- one prompt's prefill replayed per padded width (engine/prefill_graphs.py) ----------------------------


def captured(static, batch_size: int, capacity: int):
    """A batched target whose one-prompt prefills go through the CPU stand-in of a CUDA graph."""
    target = BatchedStaticTarget.from_static_target(static, batch_size)
    target.prefill_graphs = CapturedPrefill(target.module, StepGraphs(FakeCapture()))
    target.reserve(capacity)
    return target


def test_a_captured_prefill_leaves_the_slot_as_the_eager_one_and_replays_per_bucket(static):
    eager, graphed = batched(static, 2), captured(static, 2, 32)
    for prompt in (PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]):  # buckets 16, 16, 32, 16
        want, got = eager.prefill(1, prompt), graphed.prefill(1, prompt)
        n = prompt.numel()
        torch.testing.assert_close(graphed._cache.kv[:, :, 1, :, :n], eager._cache.kv[:, :, 1, :, :n])
        torch.testing.assert_close(got.hidden_states, want.hidden_states)
        torch.testing.assert_close(got.logits, want.logits)
        assert got.logits.argmax(-1).tolist() == want.logits.argmax(-1).tolist() and graphed.cache_length(1) == n
    graphs = graphed.prefill_graphs.graphs
    assert graphs.captures == {("prefill", 16): 1, ("prefill", 32): 1}
    assert graphs.replays == {("prefill", 16): 3, ("prefill", 32): 1}
    assert bucket(1) == 16 and bucket(16) == 16 and bucket(17) == 32 and bucket(33) == 64


def test_a_prompt_whose_bucket_exceeds_the_cache_is_prefilled_eagerly(static):
    graphed = captured(static, 1, 24)
    graphed.prefill(0, PROMPTS[2])  # 17 tokens: bucket 32 > 24 entries
    assert not graphed.prefill_graphs.graphs.captures and graphed.cache_length(0) == 17


def test_batched_decoding_with_captured_prefills_equals_the_eager_engine(static):
    """At B = 1 every admission is one prompt: each goes through its bucket's graph; tokens and counters unchanged."""
    config = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    prompts = PROMPTS + [random_prompt(40, 8)]  # buckets 16, 16, 32, 64
    want = BatchedDecoder(batched(static, 1), None, config).generate_all(prompts)
    target = captured(static, 1, 64)
    got = BatchedDecoder(target, None, config).generate_all(prompts)
    assert [r.output_token_ids for r in got] == [r.output_token_ids for r in want]
    assert [r.counters for r in got] == [r.counters for r in want]
    assert target.prefill_graphs.graphs.captures == {("prefill", 16): 1, ("prefill", 32): 1, ("prefill", 64): 1}


def test_prepared_prefill_graphs_write_no_slot_and_leave_nothing_to_capture_in_a_run(static):
    target = captured(static, 2, 64)
    before = target._cache.kv.clone()
    target.prepare_prefills([3, 9, 17, 40, 100])  # buckets 16, 32, 64; 100 tokens (bucket 128) does not fit
    graphs = target.prefill_graphs.graphs
    assert graphs.captures == {("prefill", 16): 1, ("prefill", 32): 1, ("prefill", 64): 1}
    assert torch.equal(target._cache.kv, before) and target.capture_seconds > 0
    config = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    BatchedDecoder(target, None, config).generate_all(PROMPTS + [random_prompt(40, 8), random_prompt(5, 9)])
    assert all(n == 1 for n in graphs.captures.values()) and sum(graphs.replays.values()) > len(graphs.captures)
    with pytest.raises(ValueError, match="prepare_prefills before reserve"):
        BatchedStaticTarget.from_static_target(static, 1).prepare_prefills([3])
