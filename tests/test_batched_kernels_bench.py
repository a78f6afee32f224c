"""bench/profile_batched_kernels.py's CPU smoke path: the JSON's structure at B = 1, 2, the kernel-kind rules and
the argument checks (no timing is asserted; off CUDA the profiler lists no kernels)."""

from __future__ import annotations

import json

import pytest

from _bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("profile_batched_kernels")


def test_cpu_report_structure(bench, tmp_path):
    assert bench.main([str(tmp_path), "--tiny", "--device", "cpu", "--batch-sizes", "2,1", "--reps", "2",
                       "--profile-steps", "1", "--context", "32", "--prompt-len", "8", "-k", "2"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["batched_kernels.json"]  # written atomically: no temp left
    report = json.loads((tmp_path / "batched_kernels.json").read_text())
    assert [p["batch_size"] for p in report["points"]] == [1, 2]  # smallest first
    for point in report["points"]:
        assert point["replayed"]["cuda_graphs"] is False and point["replayed"]["chain_width"] == 3  # K + 1
        assert point["replayed"]["t1_ms"] > 0 and point["replayed"]["chain_ms"] > 0
        for step in ("eager_plain", "eager_chain"):
            assert point[step]["kernels_per_step"] == 0 and point[step]["top"] == []  # no CUDA kernels on the CPU


@pytest.mark.parametrize("name, kind", [
    ("void pytorch_flash::flash_fwd_kernel<...>", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("nvjet_tst_128x64_64x8_1x1_v_bz_TNT", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"),
    ("void at::native::index_put_kernel_impl<...>", "kv_write"),
    ("void at::native::index_elementwise_kernel<128, 4, ...>", "kv_write"),
    ("triton_red_fused_mm_t_0", "matmul"),
    ("void at::native::vectorized_elementwise_kernel<4, ...>", "other"),
    ("ncclDevKernel_AllReduce_Sum_bf16 (comm)", "other"),
])
def test_kernel_kinds(bench, name, kind):
    assert bench.kind_of(name) == kind


def test_bad_arguments(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["out", "--tiny", "--context", "4", "--prompt-len", "8"])
    assert "--context >= prompt-len + k + 1" in capsys.readouterr().err
