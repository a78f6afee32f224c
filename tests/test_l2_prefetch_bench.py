"""bench/_l2_prefetch.py: a step whose projections prefetch the next weight's prefix into L2 decodes the engine's
tokens, prefetches exactly the next weight's first bytes in the forward's order (never the first layer's q/k/v, never
past the lm_head), and its touch kernel reads exactly the prefix it is given. The kernel runs on CUDA, or on a CPU
interpreted (``TRITON_INTERPRET=1`` with triton installed); the order and the tokens are checked on any CPU through a
recording stand-in."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

import pytest
import torch
import torch.nn.functional as F

from bench._l2_prefetch import PrefetchingLinear, parse_spec, projection_order
from specbench.checkpoints.tiny import tiny_llama
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.static_ops import EAGER_OPS
from specbench.engine.static_target import StaticTarget

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
PROMPT = torch.arange(3, 12)
CONFIG = GenerationConfig(max_new_tokens=10, ignore_eos=True)


def target(device="cpu", linear=None) -> StaticTarget:
    """The tiny fp32 GQA Llama (2 layers) on the static engine; ``linear`` wraps its projections."""
    plain = StaticTarget.from_hf_model(tiny_llama(seed=0, max_context=512).to(device))
    if linear is None:
        return plain
    return plain.with_batch_size(1, ops=dataclasses.replace(plain.ops, linear=linear(plain.ops.linear,
                                                                                    projection_order(plain.module))))


def test_every_projection_is_listed_in_the_order_the_forward_reads_it():
    module = target().module
    calls, s = [], module.shape
    ops = dataclasses.replace(EAGER_OPS, linear=lambda x, w, b=None: calls.append(w.data_ptr()) or F.linear(x, w, b))
    cache = torch.zeros(s.num_layers, 2, 1, s.num_kv_heads, 16, s.head_dim)  # (L, 2, B, KVH, S, D)
    hidden, _ = module(torch.tensor([5]), torch.tensor([0]), torch.tensor([[0]]), torch.ones(1, 1, 1, dtype=torch.bool),
                       cache, ops)  # one token at position 0 of slot 0
    module.logits(hidden, ops)
    order = projection_order(module)
    assert [name for name, _ in order] == ["qkv", "o", "gate_up", "down"] * len(module.model.layers) + ["lm_head"]
    assert calls == [weight.data_ptr() for _, weight in order]


@pytest.mark.parametrize("join", [True, False])
def test_each_matmul_prefetches_the_next_weights_prefix_and_the_tokens_are_the_engines(join):
    expected = Decoder(target(), None, CONFIG).generate(PROMPT).output_token_ids
    touched = []
    cap_o, cap_rest = 3000, 1000  # bytes: a part of every weight of the tiny model (fp32: 750 and 250 elements)

    def wrap(linear, order):
        return PrefetchingLinear(linear, order, cap_o=cap_o, cap_rest=cap_rest, programs=4, join=join,
                                 touch=lambda prefix, scratch: touched.append((prefix.data_ptr(), prefix.numel())))

    prefetching = target(linear=wrap)
    got = Decoder(prefetching, None, CONFIG).generate(PROMPT).output_token_ids
    assert list(got) == list(expected)
    order = projection_order(prefetching.module)
    per_forward = [(w.data_ptr(), min(w.numel(), (cap_o if name == "o" else cap_rest) // w.element_size()))
                   for name, w in order[1:]]  # every weight but the first layer's q/k/v, the lm_head's included
    assert all(n in (750, 250) for _, n in per_forward)  # the caps cut every weight of this model
    forwards, rest = divmod(len(touched), len(per_forward))
    # every decode step's forward: the first token is the prefill's, whose forward runs the prefill's own stages
    assert rest == 0 and forwards == CONFIG.max_new_tokens - 1
    assert touched == per_forward * forwards


def test_a_zero_cap_prefetches_nothing_in_its_windows():
    touched = []
    order = projection_order(target().module)
    linear = PrefetchingLinear(torch.nn.functional.linear, order, cap_o=0, cap_rest=400, programs=2,
                               touch=lambda prefix, scratch: touched.append(prefix.data_ptr()))
    x = torch.zeros(1, order[0][1].shape[1])
    linear(x, order[0][1])  # the first layer's q/k/v: the next is the output projection, cap 0
    _, gate_up = order[2]
    linear(torch.zeros(1, order[1][1].shape[1]), order[1][1])  # the output projection: the next is gate/up
    assert touched == [gate_up.data_ptr()]


@pytest.mark.parametrize("spec, want", [("32:4", (32 << 20, 4 << 20, True)), ("0.5:0:nojoin", (1 << 19, 0, False))])
def test_specs_parse_to_bytes_and_the_join(spec, want):
    assert parse_spec(spec) == want


@pytest.mark.parametrize("spec", ["32", "32:4:later", "a:4", "-1:4"])
def test_a_bad_spec_names_itself_and_the_form(spec):
    with pytest.raises(ValueError, match=rf"'{spec}'.*(O:R|negative)"):
        parse_spec(spec)


DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="the Triton kernel runs on a CPU only "
                                                        "interpreted: set TRITON_INTERPRET=1 with triton installed")),
           pytest.param("cuda", marks=pytest.mark.large_gpu(min_gb=1))]


@pytest.mark.parametrize("device", DEVICES)
def test_touch_reads_exactly_its_prefix(device):
    from bench._l2_prefetch import BLOCK, touch_prefix
    weight = torch.randn(7 * BLOCK + 13, generator=torch.Generator().manual_seed(0)).to(device)
    scratch = torch.zeros(3, device=device)  # 3 programs over 7 blocks and a part: uneven shares, the last masked
    prefix = weight[: 5 * BLOCK + 7]
    touch_prefix(prefix, scratch)
    torch.testing.assert_close(scratch.sum(), prefix.sum(), rtol=1e-5, atol=1e-3)  # fp32: summation order only


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs triton (pip install triton), not interpreted: the kernel is compiled for Hopper "
                    "ahead of time, with the ptxas its wheel bundles, no GPU needed")
def test_touch_compiles_for_hopper_to_16_byte_loads_cached_in_l2_only():
    """PTX and ptxas on a machine without a GPU: the kernel assembles for sm_90 (ptxas refused it once, when an L1
    eviction policy sat beside .cg), and with an aligned weight each thread reads 16-byte vectors past L1."""
    import triton
    from triton.backends.compiler import GPUTarget
    from bench._l2_prefetch import BLOCK, _touch
    aligned = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}
    source = triton.compiler.ASTSource(fn=_touch, signature={"w_ptr": "*bf16", "n": "i32", "out_ptr": "*fp32"},
                                       constexprs={"BLOCK": BLOCK}, attrs=aligned)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
    loads = set(re.findall(r"ld\.global[\w.:]*", ptx))
    assert loads == {"ld.global.cg.v4.b32"}, loads


@pytest.mark.large_gpu(min_gb=1)
@pytest.mark.parametrize("join", [True, False])
def test_cuda_graphs_with_the_side_stream_decode_the_engines_tokens(join):
    """Real CUDA graphs: the fork and join are captured as graph edges, and replays decode the engine's tokens."""
    expected = Decoder(target("cuda"), None, CONFIG).generate(PROMPT).output_token_ids
    prefetching = target("cuda", lambda linear, order: PrefetchingLinear(linear, order, cap_o=3000, cap_rest=1000,
                                                                          programs=8, join=join))
    assert prefetching.cuda_graphs
    assert list(Decoder(prefetching, None, CONFIG).generate(PROMPT).output_token_ids) == list(expected)
