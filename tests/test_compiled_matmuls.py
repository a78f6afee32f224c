"""The matmul kernels read from inductor's generated code (specbench/run/compiled_matmuls.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from specbench.run.compiled_matmuls import compiled_matmuls, matmuls_in

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


def test_a_case_s_record_keeps_only_its_own_models_matmuls():
    """A process that ran another model first holds that model's compiled graphs too; a case's record names only the
    matmuls with an input of one of its modules' weight shapes (the fused ones included)."""
    from specbench.run import kernel_choices

    linear = torch.compile(lambda x, w: F.linear(x, w), fullgraph=True, dynamic=False)
    ours, theirs = torch.nn.Linear(24, 56, bias=False), torch.randn(72, 24)
    linear(torch.randn(1, 24), ours.weight.detach())
    linear(torch.randn(1, 24), theirs)
    everything = compiled_matmuls()
    assert {"input_shapes": [[1, 24], [72, 24]], "kernels": ["aten mm"]} in everything
    kept = compiled_matmuls(kernel_choices.weight_shapes(ours))
    assert kept == [{"input_shapes": [[1, 24], [56, 24]], "kernels": ["aten mm"]}]
    fused = torch.nn.Module()
    fused.weight = theirs  # a plain tensor attribute, as FusedLinear keeps its fused weight
    assert kernel_choices.weight_shapes(ours, fused, None) == {(56, 24), (72, 24)}


# what inductor writes on a GPU for a one-row linear under coordinate-descent tuning: no mm, a reduction kernel
# named after the ATen op it came from, with that op in the comment above its definition
ROW_MM_MODULE = """
# kernel path: /tmp/torchinductor_root/ab/cabcdef.py
# Topologically Sorted Source Nodes: [linear], Original ATen: [aten.mm]
# Source node to ATen node mapping:
#   linear => mul, sum_1
# Graph fragment:
#   %mul : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%unsqueeze, %unsqueeze_1))
triton_red_fused_mm_0 = async_compile.triton('triton_red_fused_mm_0', '''
@triton_heuristics.reduction(size_hints={'x': 4096, 'r0_': 4096}, reduction_hint=ReductionHint.INNER)
def triton_red_fused_mm_0(in_ptr0, in_ptr1, out_ptr0, xnumel, r0_numel, XBLOCK, R0_BLOCK):
''', device_str='cuda')

def call(args):
    arg0_1, arg1_1 = args
    assert_size_stride(arg0_1, (1, 4096), (4096, 1))
    assert_size_stride(arg1_1, (4096, 4096), (4096, 1))
    triton_red_fused_mm_0.run(arg0_1, arg1_1, buf0, 4096, 4096, stream=stream0)
    return (buf0, )
"""


def _kernel(*configs):
    return SimpleNamespace(launchers=[SimpleNamespace(config=c) for c in configs])


def test_a_one_row_mm_decomposed_to_a_reduction_is_named_with_the_config_tuning_left():
    tuned = SimpleNamespace(kwargs={"XBLOCK": 1, "R0_BLOCK": 2048}, num_warps=16, num_stages=1)
    module = SimpleNamespace(triton_red_fused_mm_0=_kernel(tuned))
    assert matmuls_in(ROW_MM_MODULE, module) == {
        "input_shapes": [[1, 4096], [4096, 4096]],
        "kernels": ["triton_red_fused_mm_0 (one-row mm as multiply + sum: R0_BLOCK=2048, XBLOCK=1, "
                    "num_stages=1, num_warps=16)"],
    }
    # before its first launch the kernel still holds every candidate; without the module only its name is known
    untuned = SimpleNamespace(triton_red_fused_mm_0=_kernel(tuned, tuned))
    assert matmuls_in(ROW_MM_MODULE, untuned)["kernels"] == [
        "triton_red_fused_mm_0 (one-row mm as multiply + sum: not launched yet)"]
    assert matmuls_in(ROW_MM_MODULE)["kernels"] == ["triton_red_fused_mm_0 (one-row mm as multiply + sum)"]


def test_a_norm_reduction_is_not_a_matmul():
    norm = ROW_MM_MODULE.replace("aten.mm", "aten._to_copy, aten.add, aten.mean, aten.mul, aten.pow, aten.rsqrt")
    assert matmuls_in(norm) is None


def test_inductors_one_row_mm_decomposition_keeps_the_mm_as_its_origin():
    # what the record keys on, checked on this torch (meta tensors stand in for a GPU's, which the rewrite needs):
    # under coordinate-descent tuning the multiply and sum that replace a one-row mm carry aten.mm as their origin
    from torch._inductor import config
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx import traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    with config.patch(coordinate_descent_tuning=True), traceback.preserve_node_meta():
        graph = make_fx(F.linear, decomposition_table=select_decomp_table())(
            torch.randn(1, 64, device="meta"), torch.randn(32, 64, device="meta")).graph
    origins = {str(node.target): str(node.meta.get("original_aten")) for node in graph.nodes if node.op == "call_function"}
    assert origins["aten.mul.Tensor"] == origins["aten.sum.dim_IntList"] == "aten.mm.default"
