"""The matmul kernels read from inductor's generated code (specbench/engine/compiled_matmuls.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from specbench.engine.compiled_matmuls import compiled_matmuls, matmuls_in

# a generated module as inductor writes it for a Triton GEMV template (trimmed to what the reader looks at)
TEMPLATE_MODULE = """
triton_tem_fused_mm_0 = async_compile.triton('triton_tem_fused_mm_0', '''
import triton
@triton_heuristics.template(
    num_stages=4,
    num_warps=2,
    triton_meta={'signature': {'arg_A': '*bf16'}, 'device': 0},
)
@triton.jit
def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0):
    GROUP_M : tl.constexpr = 8
    EVEN_K : tl.constexpr = True
    BLOCK_M : tl.constexpr = 16
    BLOCK_N : tl.constexpr = 64
    BLOCK_K : tl.constexpr = 128
''', device_str='cuda')

triton_poi_fused_add_1 = async_compile.triton('triton_poi_fused_add_1', '''
@triton_heuristics.pointwise(num_stages=1, num_warps=8)
def triton_poi_fused_add_1(in_ptr0):
    XBLOCK : tl.constexpr = 1024
''', device_str='cuda')

def call(args):
    arg0_1, arg1_1 = args
    assert_size_stride(arg0_1, (1, 4096), (4096, 1))
    assert_size_stride(arg1_1, (11008, 4096), (4096, 1))
    triton_tem_fused_mm_0.run(arg0_1, arg1_1, buf0, grid=grid(11008), stream=stream0)
    triton_poi_fused_add_1.run(buf0, stream=stream0)
    return (buf0, )
"""


def test_a_triton_template_is_named_with_its_block_sizes_warps_and_stages():
    record = matmuls_in(TEMPLATE_MODULE)
    assert record == {
        "input_shapes": [[1, 4096], [11008, 4096]],
        "kernels": ["triton_tem_fused_mm_0 (BLOCK_K=128, BLOCK_M=16, BLOCK_N=64, EVEN_K=True, GROUP_M=8, "
                    "num_stages=4, num_warps=2)"],
    }


def test_a_module_without_a_matmul_is_not_recorded():
    assert matmuls_in("def call(args):\n    triton_poi_fused_add_1.run(buf0, stream=stream0)\n") is None


def test_aten_matmuls_of_a_graph_compiled_in_this_process_are_read_back():
    # inductor on the CPU keeps a one-row linear on ATen's mm: its generated code names it with the input shapes
    linear = torch.compile(lambda x, w: F.linear(x, w), fullgraph=True, dynamic=False)
    linear(torch.randn(1, 24), torch.randn(40, 24))
    records = compiled_matmuls()
    assert {"input_shapes": [[1, 24], [40, 24]], "kernels": ["aten mm"]} in records
    assert len(records) == len({repr(r) for r in records})  # distinct records only


# what inductor writes on a GPU for a one-row linear under coordinate-descent tuning: no mm, a reduction kernel
ROW_MM_MODULE = """
triton_red_fused__to_copy_mul_sum_0 = async_compile.triton('triton_red_fused__to_copy_mul_sum_0', '''
@triton_heuristics.reduction(size_hints={'x': 4096, 'r0_': 4096}, reduction_hint=ReductionHint.INNER)
def triton_red_fused__to_copy_mul_sum_0(in_ptr0, in_ptr1, out_ptr0, xnumel, r0_numel, XBLOCK, R0_BLOCK):
''', device_str='cuda')

def call(args):
    arg0_1, arg1_1 = args
    assert_size_stride(arg0_1, (1, 4096), (4096, 1))
    assert_size_stride(arg1_1, (4096, 4096), (4096, 1))
    triton_red_fused__to_copy_mul_sum_0.run(arg0_1, arg1_1, buf0, 4096, 4096, stream=stream0)
    return (buf0, )
"""


def _kernel(*configs):
    return SimpleNamespace(launchers=[SimpleNamespace(config=c) for c in configs])


def test_a_one_row_mm_decomposed_to_a_reduction_is_named_with_the_config_tuning_left():
    tuned = SimpleNamespace(kwargs={"XBLOCK": 1, "R0_BLOCK": 2048}, num_warps=16, num_stages=1)
    module = SimpleNamespace(triton_red_fused__to_copy_mul_sum_0=_kernel(tuned))
    assert matmuls_in(ROW_MM_MODULE, module) == {
        "input_shapes": [[1, 4096], [4096, 4096]],
        "kernels": ["triton_red_fused__to_copy_mul_sum_0 (one-row mm as multiply + sum: R0_BLOCK=2048, XBLOCK=1, "
                    "num_stages=1, num_warps=16)"],
    }
    # before its first launch the kernel still holds every candidate; without the module only its name is known
    untuned = SimpleNamespace(triton_red_fused__to_copy_mul_sum_0=_kernel(tuned, tuned))
    assert matmuls_in(ROW_MM_MODULE, untuned)["kernels"] == [
        "triton_red_fused__to_copy_mul_sum_0 (one-row mm as multiply + sum: not launched yet)"]
    assert matmuls_in(ROW_MM_MODULE)["kernels"] == ["triton_red_fused__to_copy_mul_sum_0 (one-row mm as multiply + sum)"]


def test_a_norm_reduction_is_not_a_matmul():
    norm = ROW_MM_MODULE.replace("_to_copy_mul_sum_0", "_to_copy_add_mean_mul_pow_rsqrt_0")
    assert matmuls_in(norm) is None
