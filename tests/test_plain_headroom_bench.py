"""bench/plain_headroom.py on the CPU: every way of stepping plain decoding (the engine's loop, queued or read every
step, verify with a host read, steps fed on the device, every layer compiled as one region, the forward rewritten
around stages compiled with their matmuls) gives the loop's greedy tokens; the figures' structure (no timing
asserted)."""

from __future__ import annotations

import json

import pytest

from _bench_scripts import load_bench_script


def test_device_fed_steps_give_the_loops_tokens(tmp_path):
    bench = load_bench_script("plain_headroom")
    assert bench.main([str(tmp_path), "--tiny", "--device", "cpu", "--new-tokens", "12", "--prompt-tokens", "9",
                       "--rounds", "2", "--layer-compile", "--fused-inductor"]) == 0
    figures = json.loads((tmp_path / "plain_headroom.json").read_text(encoding="utf-8"))
    rows = {row["mode"]: row for row in figures["modes"]}
    assert list(rows) == ["loop", "loop-sync", "verify", "chained", "loop-fused-inductor", "loop-layers"]  # steps-K needs CUDA graphs
    for row in rows.values():
        assert row["tokens_match_loop"] is True and row["tokens"] == 12, row
        assert len(row["ms_per_token_rounds"]) == 2
        assert row["ms_per_token"] > 0 and row["fraction_of_ceiling"] is None  # no ceiling without a GPU's bandwidth


def test_modes_picks_and_orders_the_modes_and_refuses_an_unknown_one(tmp_path, capsys):
    bench = load_bench_script("plain_headroom")
    common = [str(tmp_path), "--tiny", "--device", "cpu", "--new-tokens", "4", "--prompt-tokens", "5", "--rounds", "1"]
    assert bench.main(common + ["--modes", "chained,loop"]) == 0
    figures = json.loads((tmp_path / "plain_headroom.json").read_text(encoding="utf-8"))
    assert [row["mode"] for row in figures["modes"]] == ["chained", "loop"]
    assert all(row["tokens_match_loop"] for row in figures["modes"])
    with pytest.raises(SystemExit) as refused:
        bench.main(common + ["--modes", "loop,loop-fused"])  # loop-fused needs --fused-gemv and CUDA
    assert refused.value.code == 2 and "unknown ['loop-fused']" in capsys.readouterr().err


def test_l2_prefetch_adds_a_mode_per_spec_and_refuses_a_bad_one(tmp_path, capsys, monkeypatch):
    """bench/_l2_prefetch.py's variants: each spec a mode with the loop's tokens (the touch kernel replaced by a
    stand-in when triton is not here to interpret it); a spec not of the form O:R[:nojoin] is a usage error."""
    bench = load_bench_script("plain_headroom")
    import _l2_prefetch  # as the script imports it (bench/ on the path)
    touched = []
    monkeypatch.setattr(_l2_prefetch, "touch_prefix", lambda prefix, scratch: touched.append(prefix.numel()))
    common = [str(tmp_path), "--tiny", "--device", "cpu", "--new-tokens", "4", "--prompt-tokens", "5", "--rounds", "1"]
    assert bench.main(common + ["--l2-prefetch", "0.001:0.0005,0.001:0.0005:nojoin"]) == 0
    figures = json.loads((tmp_path / "plain_headroom.json").read_text(encoding="utf-8"))
    rows = {row["mode"]: row for row in figures["modes"]}
    assert {"loop-l2-0.001:0.0005", "loop-l2-0.001:0.0005:nojoin"} <= set(rows)
    assert all(row["tokens_match_loop"] for row in rows.values())
    assert set(touched) == {1048 // 4, 524 // 4}  # 0.001 and 0.0005 MB of fp32 weights, every weight larger
    with pytest.raises(SystemExit) as refused:
        bench.main(common + ["--l2-prefetch", "32"])
    assert refused.value.code == 2 and "'32' is not O:R or O:R:nojoin" in capsys.readouterr().err
