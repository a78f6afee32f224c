"""Batch size as a case key: a batched case's per-request records and quality figures equal the single-sequence
run's, its batch metrics are recorded, batch_sizes expands into one case per size, `specbench run --batch-size`
and `specbench sweep` run them, and bad batch input is refused naming the case, the key and the value."""

from __future__ import annotations

import json

import pytest

from specbench.run.batch import best_per_batch_size, curves
from specbench.cases import Case, load_suite, with_overrides
from specbench.cli import main
from specbench.run.harness import run_case

REFERENCE = {
    "name": "chain", "suite": "batch", "target": "specbench-ref/gsm8k-tiny", "engine": "static",
    "proposer": {"name": "medusa", "path": "specbench-ref/gsm8k-tiny-medusa", "num_speculative_tokens": 3},
    "prompts": {"name": "gsm8k-embedded", "num_prompts": 4}, "max_new_tokens": 48,  # EOS ends some requests early
}
PER_REQUEST = ("prompt_id", "output_token_ids", "plain_output_token_ids", "num_drafts", "num_draft_tokens",
               "num_accepted_tokens", "accepted_per_position", "acceptance_rate", "mean_acceptance_length",
               "finish_reason")
QUALITY = ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance_rate", "num_drafts",
           "num_draft_tokens", "num_accepted_tokens", "num_output_tokens", "num_requests")
BATCH_METRICS = ("batch_size", "throughput_tokens_per_s", "plain_throughput_tokens_per_s", "batch_speedup", "queue_s")


def toml_case(path, **changes) -> str:
    """A one-case suite file of REFERENCE with ``changes``, as TOML."""
    case = {**REFERENCE, **changes}
    lines = ['suite = "batch"', "[[case]]"]
    for key, value in case.items():
        if key == "suite":
            continue
        lines.append(f"{key} = {_inline(value) if isinstance(value, dict) else json.dumps(value)}")  # JSON scalars and lists are TOML
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _inline(table: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + " }"


@pytest.fixture(scope="module")
def runs():
    """The reference case on the single-sequence loop (no batch_size), and at batch sizes 1 and 3."""
    single = run_case(Case.from_dict(dict(REFERENCE)), progress=False).to_dict()
    batched = {b: run_case(Case.from_dict({**REFERENCE, "batch_size": b}), progress=False).to_dict() for b in (1, 3)}
    return single, batched


def test_a_batched_case_records_each_request_as_the_single_sequence_run_does(runs):
    single, batched = runs
    assert sum(r["num_accepted_tokens"] for r in single["requests"]) > 0  # something to compare
    assert {r["finish_reason"] for r in single["requests"]} == {"eos", "length"}  # EOS frees slots mid-run
    for size, result in batched.items():
        for got, want in zip(result["requests"], single["requests"], strict=True):
            assert {k: got[k] for k in PER_REQUEST} == {k: want[k] for k in PER_REQUEST}, size
        assert {k: result["metrics"][k] for k in QUALITY} == {k: single["metrics"][k] for k in QUALITY}, size
        assert result["correctness"] == single["correctness"] and result["correctness"]["checked"]
        assert result["correctness"]["exact"]
    assert batched[3]["details"]["batch"]["num_refills"] == 1  # 4 prompts through 3 slots


def test_batch_metrics_are_recorded_and_the_unbatched_result_has_none(runs):
    single, batched = runs
    assert not set(BATCH_METRICS) & set(single["metrics"]) and "batch_size" not in single["case"]
    for size, result in batched.items():
        m = result["metrics"]
        assert m["batch_size"] == size == result["case"]["batch_size"]
        assert m["throughput_tokens_per_s"] > 0 and m["plain_throughput_tokens_per_s"] > 0
        assert m["batch_speedup"] == m["throughput_tokens_per_s"] / m["plain_throughput_tokens_per_s"]  # one repeat
        assert m["time_to_first_token_s"] > 0 and m["per_token_latency_s"] > 0 and m["queue_s"] >= 0
        assert m["peak_memory_bytes"] is None  # CUDA only
        (repeat,) = result["repeats"]
        assert repeat["wall_s"] > 0 and repeat["throughput_tokens_per_s"] == m["throughput_tokens_per_s"]
    # slot waits: with one slot the last request waits for the three before it, with three slots only for one
    assert batched[1]["metrics"]["queue_s"] > batched[3]["metrics"]["queue_s"]


def test_a_batch_sizes_case_expands_into_one_case_per_size(tmp_path):
    cases = load_suite(toml_case(tmp_path / "sweep.toml", batch_sizes=[1, 2, 4]))
    assert [c.case_id for c in cases] == ["batch/chain[batch_size=1]", "batch/chain[batch_size=2]",
                                          "batch/chain[batch_size=4]"]
    assert [c.batch_size for c in cases] == [1, 2, 4] and all(c.batch_sizes is None for c in cases)
    assert all(c.to_dict() == {**cases[0].to_dict(), "name": c.name, "batch_size": c.batch_size} for c in cases)


def test_curves_group_results_that_differ_only_in_batch_size(runs):
    single, batched = runs
    (curve,) = curves([single, batched[1], batched[3]])  # the unbatched result is on no curve
    assert curve["case_id"] == "batch/chain"
    assert [p["batch_size"] for p in curve["points"]] == [1, 3]
    assert [p["throughput_tokens_per_s"] for p in curve["points"]] == [
        batched[b]["metrics"]["throughput_tokens_per_s"] for b in (1, 3)]
    assert len({p["acceptance_rate"] for p in curve["points"]}) == 1


def test_run_with_batch_size_and_a_batch_sizes_suite_print_the_curve(tmp_path, capsys):
    small = {"prompts": {"name": "gsm8k-embedded", "num_prompts": 2}, "max_new_tokens": 6}
    sweep_file = toml_case(tmp_path / "sweep.toml", batch_sizes=[1, 2], **small)
    assert main(["run", sweep_file, "--no-gate", "--no-history", "-q"]) == 0
    out = capsys.readouterr().out
    assert "batch-size curve of batch/chain:" in out
    table = out.split("batch-size curve of batch/chain:\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split()[:2] == ["B", "throughput"] and [row.split()[0] for row in table[1:]] == ["1", "2"]

    output = tmp_path / "r.json"
    assert main(["run", toml_case(tmp_path / "one.toml", **small), "--batch-size", "2", "--output", str(output),
                 "--no-history", "-q"]) == 0
    result = json.loads(output.read_text())
    assert result["case_id"] == "batch/chain[batch_size=2]" and result["metrics"]["batch_size"] == 2


def test_sweep_writes_the_grid_and_the_best_k_per_batch_size(tmp_path, capsys):
    output = tmp_path / "grid" / "sweep.json"
    case = toml_case(tmp_path / "one.toml", prompts={"name": "gsm8k-embedded", "num_prompts": 2}, max_new_tokens=6)
    assert main(["sweep", case, "--batch-sizes", "1,2", "--num-speculative-tokens", "1,2", "--output", str(output),
                 "-q"]) == 0
    grid = json.loads(output.read_text())
    assert grid["batch_sizes"] == [1, 2] and grid["num_speculative_tokens"] == [1, 2]
    assert sorted((p["num_speculative_tokens"], p["batch_size"]) for p in grid["points"]) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert len({p["case_id"] for p in grid["points"]}) == 4
    assert all(p["correctness"]["exact"] and p["metrics"]["throughput_tokens_per_s"] > 0 for p in grid["points"])
    for best in grid["best"]:
        at_b = [p for p in grid["points"] if p["batch_size"] == best["batch_size"]]
        top = max(at_b, key=lambda p: p["metrics"]["throughput_tokens_per_s"])
        assert best["num_speculative_tokens"] == top["num_speculative_tokens"]
        assert best["throughput_tokens_per_s"] == top["metrics"]["throughput_tokens_per_s"]
    assert [b["batch_size"] for b in grid["best"]] == [1, 2]
    out = capsys.readouterr().out
    for best in grid["best"]:
        assert f"  B={best['batch_size']}: K={best['num_speculative_tokens']} (" in out


def test_best_k_skips_faulted_points_and_prefers_the_smaller_k_on_ties():
    points = [{"batch_size": 2, "num_speculative_tokens": 1, "metrics": {"throughput_tokens_per_s": 5.0}},
              {"batch_size": 2, "num_speculative_tokens": 3, "metrics": {"throughput_tokens_per_s": 5.0}},
              {"batch_size": 2, "num_speculative_tokens": 2, "error": {"type": "MemoryError"}},
              {"batch_size": 4, "num_speculative_tokens": 2, "error": {"type": "MemoryError"}}]
    assert [(b["batch_size"], b["num_speculative_tokens"]) for b in best_per_batch_size(points)] == [(2, 1)]


# --- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes, message", [
    ({"batch_size": 0}, r"origin: batch_size must be an integer >= 1 \(requests decoded together\), found 0"),
    ({"batch_size": 2.0}, r"origin: batch_size must be an integer >= 1 .*, found 2.0"),
    ({"batch_size": True}, r"origin: batch_size must be an integer >= 1 .*, found True"),
    ({"batch_sizes": []}, r"origin: batch_sizes must be a non-empty list of distinct integers >= 1, e.g. \[1, 2, 4, 8\], found \[\]"),
    ({"batch_sizes": [1, 2, 2]}, r"batch_sizes must be .*, found \[1, 2, 2\]"),
    ({"batch_sizes": [1, "2"]}, r"batch_sizes must be .*, found \[1, '2'\]"),
    ({"batch_sizes": 4}, r"batch_sizes must be .*, found 4"),
    ({"batch_size": 2, "batch_sizes": [1, 2]}, r"origin: set batch_size \(one size\) or batch_sizes \(a sweep\), not "
                                               r"both; found batch_size = 2 and batch_sizes = \[1, 2\]"),
    ({"batch_size": 2, "engine": "eager"}, r"origin: batch_size = 2 runs the batched engine, which needs engine = "
                                           r"\"static\", and the case has engine = 'eager'; set engine = \"static\" "
                                           r"\(--engine static\) or drop batch_size"),
    ({"batch_sizes": [1, 4], "engine": "eager"}, r"batch_sizes = \[1, 4\] runs the batched engine, which needs engine"),
])
def test_bad_batch_keys_are_refused_naming_the_case_key_and_value(changes, message):
    with pytest.raises(ValueError, match=message):
        Case.from_dict({**REFERENCE, **changes}, origin="origin")


def test_a_sweep_case_is_not_overridden_or_run_as_one_case():
    case = Case.from_dict({**REFERENCE, "batch_sizes": [1, 2]})
    with pytest.raises(ValueError, match=r"case batch/chain is a batch_sizes sweep \[1, 2\]: override one of its "
                                         r"points .*chain\[batch_size=1\]"):
        with_overrides(case, {"max_new_tokens": 4})
    with pytest.raises(ValueError, match=r"case batch/chain is a batch_sizes sweep \[1, 2\]: run its points"):
        run_case(case, progress=False)


@pytest.mark.parametrize("argv, message", [
    (["run", "medusa/chain-k3", "--batch-size", "0"], "argument --batch-size: expected an integer >= 1 (requests "
                                                      "decoded together), got '0'"),
    (["run", "medusa/chain-k3", "--batch-size", "2"], "batch_size = 2 runs the batched engine, which needs engine = "
                                                      "\"static\", and the case has engine = 'eager'; set engine = "
                                                      "\"static\" (--engine static)"),
    (["sweep", "medusa/chain-k3", "--batch-sizes", "1,1"], "argument --batch-sizes: expected distinct batch_size "
                                                           "values, got [1] more than once in '1,1'"),
    (["sweep", "medusa/chain-k3", "--batch-sizes", "1,x"], "argument --batch-sizes: expected a comma-separated list "
                                                           "of batch_size values, each an integer >= 1 (requests "
                                                           "decoded together); got 'x' in '1,x'"),
    (["sweep", "medusa/chain-k3", "--batch-sizes", ""], "got '' in ''"),
    (["sweep", "medusa/chain-k3", "--num-speculative-tokens", "0,2"], "argument --num-speculative-tokens: expected a "
                                                                      "comma-separated list of num_speculative_tokens "
                                                                      "values, each an integer >= 1; got '0' in '0,2'"),
    (["sweep", "medusa/tree-63", "--engine", "static", "--num-speculative-tokens", "1,2"],
     "num_speculative_tokens sets the length of a draft chain, and case medusa/tree-63 drafts the tree "
     "'gsm8k-tiny-63'; drop the num_speculative_tokens setting (--num-speculative-tokens) or pick a chain case"),
    (["sweep", "medusa/chain-k3", "--batch-sizes", "1,2"], "set engine = \"static\" (--engine static) or drop batch_size"),
    (["sweep", "medusa", "--engine", "static"], "specbench sweep runs one case, and 'medusa' names"),
])
def test_bad_batch_flags_exit_2_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_cache_that_cannot_fit_is_the_case_error_before_allocation(tmp_path, capsys):
    case = Case.from_dict({"name": "huge", "suite": "batch", "engine": "static", "batch_size": 10**9,
                           "prompts": {"name": "synthetic", "num_prompts": 2}, "max_new_tokens": 4})
    with pytest.raises(MemoryError, match=r"batch_size 1000000000 needs a static KV cache of \d+ bytes .* but cpu has "
                                          r"\d+ bytes free; lower batch_size \(at most \d+ fit at this length\)"):
        run_case(case, progress=False)
    suite = tmp_path / "huge.toml"
    suite.write_text('[[case]]\nname = "huge"\nengine = "static"\nbatch_size = 1000000000\n'
                     'prompts = { name = "synthetic", num_prompts = 2 }\nmax_new_tokens = 4\n', encoding="utf-8")
    assert main(["run", str(suite), "--no-gate", "--no-history", "-q"]) == 1
    out = capsys.readouterr().out
    assert "huge/huge: ERROR MemoryError: batch_size 1000000000 needs a static KV cache of" in out


def test_an_eagle3_case_runs_batched_with_the_aux_layer_features(tmp_path):
    """EAGLE-3 sets its aux layers on the static target it is built for; the batched target must read them too."""
    eagle3 = {**REFERENCE, "name": "eagle3-chain-k3", "max_new_tokens": 24,
              "prompts": {"name": "gsm8k-embedded", "num_prompts": 3},
              "proposer": {"name": "eagle3", "path": "specbench-ref/gsm8k-tiny-eagle3", "num_speculative_tokens": 3}}
    single = run_case(Case.from_dict(eagle3), progress=False).to_dict()
    batched = run_case(Case.from_dict({**eagle3, "batch_size": 2}), progress=False).to_dict()
    assert sum(r["num_accepted_tokens"] for r in single["requests"]) > 0
    for got, want in zip(batched["requests"], single["requests"], strict=True):
        assert {k: got[k] for k in PER_REQUEST} == {k: want[k] for k in PER_REQUEST}
    assert batched["details"]["proposer"]["batching"].startswith("batched head")
