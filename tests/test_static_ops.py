"""The static engine's pointwise stages: fused by torch.compile they compute what the eager stages do."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from specbench.engine import static_ops
from specbench.engine.static_ops import EAGER_OPS, compiled_ops
from specbench.engine.static_target import StaticTarget
from specbench.proposers.medusa import MedusaProposer
from test_static_target import build, decode, random_heads

NH, KVH, D = 4, 2, 16


def stage_inputs(width: int, gen: torch.Generator) -> dict:
    hidden = 32
    positions = torch.randint(0, 200, (width,), generator=gen)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))  # (D/2,)
    cos, sin = static_ops.rotary_tables(inv_freq, positions, torch.float32)  # (W, D)
    return {
        "rotary_tables": (inv_freq, positions, torch.float32),
        "rms_norm": (torch.randn(width, hidden, generator=gen), torch.randn(hidden, generator=gen), 1e-6),
        "add_rms_norm": (torch.randn(width, hidden, generator=gen), torch.randn(width, hidden, generator=gen),
                         torch.randn(hidden, generator=gen), 1e-5),
        # W nodes in one slot, or two slots of W / 2 where W is even, at cache entries 3.. of a cache of 80 (each
        # call gets its own copy of it: _with_own_cache)
        "rope_into_cache": (torch.randn(width, (NH + 2 * KVH) * D, generator=gen), cos, sin, NH, KVH,
                            torch.randn(2, 2 - width % 2, KVH, 80, D, generator=gen),
                            torch.arange(3, 3 + width).view(2 - width % 2, -1)),
        "rotate_heads": (torch.randn(width, (NH + 2 * KVH) * D, generator=gen), cos, sin, NH, KVH),
        "swiglu": (torch.randn(width, 48, generator=gen),),
    }


@pytest.fixture(scope="module")
def fused():
    return compiled_ops()


def _with_own_cache(name: str, args: tuple) -> tuple[tuple, torch.Tensor | None]:
    """``args`` with rope_into_cache's cache cloned (the stage writes it), and that cache (None for other stages)."""
    if name != "rope_into_cache":
        return args, None
    cache = args[5].clone()
    return (*args[:5], cache, args[6]), cache


@pytest.mark.parametrize("width", [1, 4, 64])  # plain, a K=3 chain, a 63-node tree: one recompile after the first
def test_each_compiled_stage_matches_the_eager_stage(fused, width):
    """Inductor may reorder an fp32 reduction (the norm's mean of squares) but computes the same formula:
    agreement within 1e-5 relative to values of order 1 is a few ulps per element. The cache the rotary stage
    writes is compared too."""
    gen = torch.Generator().manual_seed(width)
    for name, args in stage_inputs(width, gen).items():
        (eager_args, eager_cache), (fused_args, fused_cache) = _with_own_cache(name, args), _with_own_cache(name, args)
        want, got = getattr(EAGER_OPS, name)(*eager_args), getattr(fused, name)(*fused_args)
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        if eager_cache is not None:
            want, got = (*want, eager_cache), (*got, fused_cache)
        for w, g in zip(want, got):
            assert g.shape == w.shape and g.dtype == w.dtype, name
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} (width {width}): {m}")


def test_rope_into_cache_hands_attention_its_layout_and_writes_each_slots_row():
    """Two slots of three nodes at different cache entries: each node's rotated key and its value land in its own
    slot's row at its entry, and nothing else in the cache changes."""
    gen = torch.Generator().manual_seed(0)
    qkv, cos, sin = stage_inputs(6, gen)["rope_into_cache"][:3]
    cache = torch.randn(2, 2, KVH, 40, D, generator=gen)  # (2, B, KVH, S, D)
    before, slots = cache.clone(), torch.tensor([[5, 6, 7], [20, 21, 22]])  # (B, W)
    q = EAGER_OPS.rope_into_cache(qkv, cos, sin, NH, KVH, cache, slots)
    assert q.shape == (1, NH, 6, D) and q.is_contiguous()
    _, k, v = EAGER_OPS.rotate_heads(qkv, cos, sin, NH, KVH)  # (KVH, 6, D) each
    written = torch.zeros_like(cache, dtype=torch.bool)
    for b in range(2):
        for w in range(3):
            assert torch.equal(cache[0, b, :, slots[b, w]], k[:, 3 * b + w])
            assert torch.equal(cache[1, b, :, slots[b, w]], v[:, 3 * b + w])
            written[:, b, :, slots[b, w]] = True
    assert torch.equal(cache[~written], before[~written])
    # values pass through unrotated: the last KVH heads of the projection
    assert torch.equal(cache[1, 1, :, 20], qkv.view(6, NH + 2 * KVH, D)[3, NH + KVH:])
    # position 0 has cos 1 and sin 0: its queries and keys are the projection's own
    zero = stage_inputs(1, gen)["rope_into_cache"][0]
    one = torch.zeros(2, 1, KVH, 4, D)
    q0 = EAGER_OPS.rope_into_cache(zero, torch.ones(1, D), torch.zeros(1, D), NH, KVH, one, torch.tensor([[2]]))
    assert torch.equal(q0[0, :, 0], zero.view(NH + 2 * KVH, D)[:NH])
    assert torch.equal(one[0, 0, :, 2], zero.view(NH + 2 * KVH, D)[NH:NH + KVH])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.large_gpu(min_gb=1))])
def test_compiled_rope_into_cache_writes_the_cache_in_place_without_a_copy_of_it(device):
    """The stage's write must compile to an in-place store: written as a ``scatter_``, inductor's code allocates a
    buffer of the layer's whole cache and copies it back (per layer and step, the cache's size in traffic). Every
    buffer inductor's code allocates here (C++ on the CPU, Triton's host code on CUDA) must be smaller than the
    cache; and only the layer written changes."""
    from torch._inductor.utils import run_and_get_code
    gen = torch.Generator().manual_seed(2)
    qkv, cos, sin = (t.to(device) for t in stage_inputs(6, gen)["rope_into_cache"][:3])
    cache = torch.zeros(3, 2, 2, KVH, 64, D, device=device)  # (layers, 2, B, KVH, S, D)
    slots = torch.tensor([[5, 6, 7], [9, 10, 11]], device=device)  # (B, W)
    stage = torch.compile(static_ops.rope_into_cache, fullgraph=True)
    _, codes = run_and_get_code(stage, qkv, cos, sin, NH, KVH, cache[1], slots)
    sizes = [math.prod(int(n) for n in shape.split(",") if n.strip())
             for code in codes for shape in re.findall(r"empty_strided\w*\(\(([\d, ]+)\)", code)]
    assert sizes and max(sizes) < cache[1].numel(), sizes
    assert cache[0].count_nonzero() == 0 and cache[2].count_nonzero() == 0 and cache[1].count_nonzero() > 0


def test_rotate_heads_hands_a_group_prefill_views_with_a_contiguous_last_dimension():
    """Group prefill (Attention.prefill_rows) passes q, k and v to attention and the cache as they come: the
    rotated q and k of rope_into_cache, unstacked, and the projection's own values."""
    gen = torch.Generator().manual_seed(1)
    qkv, cos, sin, nh, kvh = stage_inputs(5, gen)["rotate_heads"]
    q, k, v = EAGER_OPS.rotate_heads(qkv, cos, sin, nh, kvh)
    assert q.shape == (NH, 5, D) and k.shape == v.shape == (KVH, 5, D)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    cache = torch.zeros(2, 1, KVH, 8, D)  # one slot of 5 nodes at entries 0..4
    stacked_q = EAGER_OPS.rope_into_cache(qkv, cos, sin, nh, kvh, cache, torch.arange(5)[None])
    assert torch.equal(q, stacked_q[0]) and torch.equal(k, cache[0, 0, :, :5]) and torch.equal(v, cache[1, 0, :, :5])
    assert v.data_ptr() == qkv[:, (NH + KVH) * D:].data_ptr()  # a view: values are not copied


def test_compiled_static_target_decodes_as_the_eager_stages():
    """On the CPU the stages stay eager unless asked; compiled (inductor's C++ kernels here, Triton on CUDA)
    the random tiny model's greedy margins (initializer_range 0.2) dwarf fp32 reordering, so tokens and
    counters must be equal for plain, chain and tree steps."""
    model = build("llama3-rope-tied")
    assert not StaticTarget.from_hf_model(model).compiled  # CPU default: eager stages
    compiled, eager = StaticTarget.from_hf_model(model, compile=True), StaticTarget.from_hf_model(model, compile=False)
    assert compiled.compiled and compiled.ops.compiled
    heads = random_heads()
    prompt = torch.arange(5, 30)
    for use in (None, {"num_speculative_tokens": 3}, {"tree": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}):
        want = decode(eager, use and MedusaProposer.from_options(eager, heads=heads, **use), prompt, reserve=True)
        got = decode(compiled, use and MedusaProposer.from_options(compiled, heads=heads, **use), prompt, reserve=True)
        assert got.output_token_ids == want.output_token_ids, use
        assert got.counters == want.counters, use


def test_compiled_stages_take_more_step_shapes_than_dynamos_default_limit_in_one_process():
    """A suite runs several models and batch sizes in one process, and a step of one slot, of one node or of one
    key/value head specialises the compiled stages again (dynamo treats sizes of 1 apart); with fullgraph=True its
    default limit of 8 specialisations per function is a hard error at the 9th (a random soak of the engine hit it),
    so compiled_ops raises it. The compiled rotary stage over 2 key/value head counts x 2 batch sizes x 2 widths x 2
    head sizes, each against the eager stage (without the raised limit: fails, checked)."""
    ops, gen = static_ops.compiled_ops(), torch.Generator().manual_seed(3)
    for kvh, batch, width, d in itertools.product((2, 1), (1, 2), (1, 3), (16, 32)):
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))  # (D/2,)
        qkv = torch.randn(batch * width, (NH + 2 * kvh) * d, generator=gen)  # (B * W, (NH + 2 KVH) * D)
        cos, sin = static_ops.rotary_tables(inv_freq, torch.arange(5, 5 + batch * width), torch.float32)  # (B * W, D)
        slots = torch.arange(5, 5 + width).repeat(batch, 1)  # (B, W)
        cache, eager_cache = torch.zeros(2, batch, kvh, 16, d), torch.zeros(2, batch, kvh, 16, d)
        q = ops.rope_into_cache(qkv, cos, sin, NH, kvh, cache, slots)
        assert torch.allclose(q, EAGER_OPS.rope_into_cache(qkv, cos, sin, NH, kvh, eager_cache, slots))
        assert torch.allclose(cache, eager_cache)
