"""bench/replay_profile.py: a trace's kernels part into replays at the pauses between them, and each replay's span,
busy time (overlaps counted once), gaps and time by kind come out exact; on the CPU the whole script runs (CPU ops
stand in for kernels) and its saved trace analyses again to the same figures."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from _bench_scripts import load_bench_script


def kernel(start: float, duration: float, name: str) -> dict:
    return {"cat": "kernel", "ts": start, "dur": duration, "name": name}


def test_replays_part_at_pauses_and_count_each_busy_microsecond_once():
    bench = load_bench_script("replay_profile")
    replay = [kernel(0, 10, "nvjet_gemv"), kernel(12, 3, "triton_poi_fused_rms_norm"), kernel(13, 4, "fmha_kernel"),
              kernel(20, 5, "nvjet_gemv")]  # busy 10 + 5 (12..17, overlapping) + 5; gaps 2 + 3
    events = [dict(e, ts=e["ts"] + offset) for offset in (0, 1000, 2000, 3000) for e in replay]
    events.append({"cat": "cpu_op", "ts": 5, "dur": 900, "name": "aten::linear"})  # CPU ops are not kernels
    figures = bench.analyze({"traceEvents": events}, ceiling_us=20.0)
    assert figures["replays"] == 3  # 4 found, the first dropped (warm-up)
    assert (figures["kernels"], figures["span_us"], figures["busy_us"], figures["gaps_us"]) == (4, 25, 20, 5)
    assert figures["by_kind_us"] == {"matmul": 15, "other": 3, "attention": 4}
    assert figures["span_of_ceiling"] == pytest.approx(0.8) and figures["matmul_of_ceiling"] == pytest.approx(20 / 15)
    assert figures["top_kernels_us"][0] == ("nvjet_gemv", 15)


def test_a_trace_without_kernels_is_refused_naming_what_was_expected():
    bench = load_bench_script("replay_profile")
    with pytest.raises(ValueError, match="no kernel.*ProfilerActivity.CUDA"):
        bench.analyze({"traceEvents": [{"cat": "python_function", "ts": 0, "dur": 1, "name": "f"}]})


def test_the_cpu_smoke_run_writes_figures_and_a_trace_that_analyses_the_same(tmp_path):
    bench = load_bench_script("replay_profile")
    assert bench.main([str(tmp_path / "run"), "--tiny", "--device", "cpu", "--replays", "3"]) == 0
    figures = json.loads((tmp_path / "run" / "replay_profile.json").read_text(encoding="utf-8"))
    assert figures["replays"] == 2 and figures["kernels"] > 0 and figures["ceiling_us"] is None
    assert 0 < figures["busy_us"] <= figures["span_us"]
    assert bench.main([str(tmp_path / "again"), "--analyze", str(tmp_path / "run" / "replay_trace.json.gz")]) == 0
    again = json.loads((tmp_path / "again" / "replay_profile.json").read_text(encoding="utf-8"))
    assert again == figures


EAGLE_DRAFT = ["--tiny", "--device", "cpu", "--replays", "3", "--step", "eagle-draft", "--top-k", "3", "--depth", "4",
               "--total-tokens", "10"]


def test_the_eagle_draft_step_replays_every_expansion_of_the_dynamic_tree(tmp_path, capsys):
    """--step eagle-draft on the CPU: the rule's depth - 1 expansions of top_k nodes are counted, and each replay's
    CPU ops run the head's attention once per expansion."""
    bench = load_bench_script("replay_profile")
    assert bench.main([str(tmp_path)] + EAGLE_DRAFT) == 0
    assert "3 expansions of widths [3, 3, 3]" in capsys.readouterr().out
    trace = json.loads(gzip.decompress((tmp_path / "replay_trace.json.gz").read_bytes()))
    replays = bench.replays_of(trace)
    assert len(replays) == 3
    for replay in replays:
        assert sum(name == "aten::scaled_dot_product_attention" for _, _, name in replay) == 3


def test_the_compiled_draft_candidate_drafts_the_eager_steps_tokens(tmp_path, capsys):
    """--compile-draft: dynamo traces the whole draft step in one graph (fullgraph: a break is an error) and, in
    fp32, its tokens equal the eager step's on the same roots (only a near-tie of ~1e-6 could part them)."""
    bench = load_bench_script("replay_profile")
    assert bench.main([str(tmp_path)] + EAGLE_DRAFT + ["--compile-draft"]) == 0
    agreement = re.search(r"compiled draft: ([0-9.]+) of its tokens", capsys.readouterr().out)
    assert agreement and float(agreement.group(1)) == 1.0


def test_the_l2_prefetch_variant_profiles_the_plain_step_and_refuses_a_bad_request(tmp_path, monkeypatch, capsys):
    """--l2-prefetch: the plain step's replays run the prefetching projections (a recording stand-in for the touch
    kernel on a CPU without triton), with the spec's sizes; another step, or a bad spec, is a usage error."""
    bench = load_bench_script("replay_profile")
    import _l2_prefetch  # as the script imports it (bench/ on the path)
    touched = []
    monkeypatch.setattr(_l2_prefetch, "touch_prefix", lambda prefix, scratch: touched.append(prefix.numel()))
    tiny = ["--tiny", "--device", "cpu", "--replays", "3"]
    assert bench.main([str(tmp_path)] + tiny + ["--l2-prefetch", "0.001:0.0005"]) == 0
    assert set(touched) == {1048 // 4, 524 // 4}  # 0.001 and 0.0005 MB of fp32 weights
    assert bench.kind_of("_touch") == "l2_prefetch"  # the Triton kernel's name in a trace: its own kind
    for extra, message in ((["--step", "eagle-draft", "--l2-prefetch", "1:1"], "plain step only"),
                           (["--l2-prefetch", "1"], "'1' is not O:R")):
        with pytest.raises(SystemExit) as refused:
            bench.main([str(tmp_path)] + tiny + extra)
        assert refused.value.code == 2 and message in capsys.readouterr().err


def test_the_chunked_top_k_candidate_drafts_torch_topks_tokens_compiled_too(tmp_path, capsys, monkeypatch):
    """--chunked-topk: the rules' vocabulary top-k goes through chunks, traced whole by dynamo with --compile-draft,
    and the draft's tokens equal torch.topk's on the same roots (fp32: no ties)."""
    from specbench.eagle import top_k
    monkeypatch.setattr(top_k, "CHUNK", top_k.CHUNK)  # the script sets it: restored after
    bench = load_bench_script("replay_profile")
    assert bench.main([str(tmp_path)] + EAGLE_DRAFT + ["--chunked-topk", "16", "--compile-draft"]) == 0
    out = capsys.readouterr().out
    assert "chunked top-k: 1.000 of the eager draft's tokens" in out and "compiled draft: 1.000" in out
    assert top_k.CHUNK == 16  # the replays ran the candidate
