"""bench/_fused_gemv.py: the GEMVs that compute their own input (a residual add's RMSNorm, SwiGLU's product) equal the
engine's stages followed by a matmul, and bench/_fused_forward.py's one-row forward over them decodes the engine's
greedy tokens. Its
Triton kernels run on CUDA, or on a CPU interpreted (``TRITON_INTERPRET=1`` with triton installed; fp32)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from specbench.checkpoints.tiny import tiny_llama
from specbench.engine import static_ops
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.static_target import StaticTarget

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="the Triton kernels run on a CPU only "
                                                        "interpreted: set TRITON_INTERPRET=1 with triton installed")),
           pytest.param("cuda", marks=pytest.mark.large_gpu(min_gb=1))]


@pytest.mark.parametrize("device", DEVICES)
def test_fused_gemvs_equal_the_stages_then_a_matmul(device):
    from bench._fused_gemv import norm_gemv, swiglu_gemv
    gen = torch.Generator().manual_seed(0)
    k, n = 200, 70  # neither a multiple of a block: the masks are exercised
    x, delta, norm_weight, gate_up = (torch.randn(shape, generator=gen).to(device) for shape in ((1, k), (1, k), k, (1, 2 * k)))
    weight = torch.randn(n, k, generator=gen).to(device)
    h, out = norm_gemv(x, delta, norm_weight, 1e-6, weight)
    stream, normed = static_ops.add_rms_norm(x, delta, norm_weight, 1e-6)
    assert torch.equal(h, stream)  # the residual add is one rounding, the same
    torch.testing.assert_close(out, normed @ weight.T, rtol=1e-4, atol=1e-4)  # fp32: summation order only
    first, out = norm_gemv(x, None, norm_weight, 1e-6, weight)  # the first layer: no residual add
    assert first is x
    torch.testing.assert_close(out, static_ops.rms_norm(x, norm_weight, 1e-6) @ weight.T, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(swiglu_gemv(gate_up, weight), static_ops.swiglu(gate_up) @ weight.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_the_fused_one_row_forward_decodes_the_engines_tokens(device, monkeypatch):
    import bench._fused_gemv as fused_gemv
    from bench._fused_forward import fused_plain_forward
    prompt = torch.arange(3, 12)
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)

    def target():  # fp32, GQA (4 heads, 2 key/value heads), 2 layers
        # eager stages and no graphs: every step runs the Python forward, so the fused calls can be counted
        return StaticTarget.from_hf_model(tiny_llama(seed=0, max_context=512).to(device), compile=False,
                                          cuda_graphs=False)

    expected = Decoder(target(), None, config).generate(prompt).output_token_ids
    calls = []
    swiglu_gemv = fused_gemv.swiglu_gemv
    monkeypatch.setattr(fused_gemv, "swiglu_gemv", lambda *args: calls.append(1) or swiglu_gemv(*args))
    fused = target()
    fused.module.forward = fused_plain_forward(fused.module, (fused_gemv.norm_gemv, fused_gemv.swiglu_gemv,
                                                              fused_gemv.gemv))
    assert Decoder(fused, None, config).generate(prompt).output_token_ids == expected
    assert len(calls) == 11 * 2  # every decode step after the first token, in both layers: the fused path ran
