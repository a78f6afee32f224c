"""Conformance suite: every proposer family on vLLM against specbench's eager engine, on the reference family
(docs/conformance.md). The cases of specbench/cases/conformance.toml are gated on their conformance verdict (exact
outputs and per-request counters where both engines implement the same rule); the tests below it show each vLLM
divergence that issue #26 found, asserting the divergence itself, so each of them fails (and is noticed) the day
vLLM fixes it. Skipped, with the reason, where vLLM (or, for the CUDA twins, its CUDA build) is not installed."""

from __future__ import annotations

import json

import pytest

from specbench.pytest_plugin import case_params, skip_unless_available

REFERENCE = "specbench-ref/gsm8k-tiny"
NUM_PROMPTS, MAX_NEW_TOKENS = 10, 64  # the figures of issue #26 (docs/conformance.md#figures)


def skip_without_vllm(device: str = "cpu") -> None:
    from specbench.engines.vllm_engine import unavailable

    why = unavailable(device)
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("case", case_params("conformance"))
def test_conformance_case(case, specbench_run):
    skip_unless_available(case)
    skip_without_vllm(case.device)
    result = specbench_run(case)  # fails unless the conformance verdict passed (or named a known divergence)
    conformance = result["correctness"]["conformance"]
    assert conformance["checked"], conformance["reason"]
    if not conformance["known_divergences"]:
        assert conformance["exact"] and conformance["counters_compared"], conformance["reason"]
    metrics = result["metrics"]
    print(f"{result['case_id']}: vLLM {metrics['num_drafts']} / {metrics['num_draft_tokens']} / "
          f"{metrics['num_accepted_tokens']}, specbench {conformance['reference_metrics']}")


def _case(proposer: dict, name: str):
    from specbench.cases import Case

    return Case.from_dict({"name": name, "suite": "conformance", "engine": "vllm", "target": REFERENCE,
                           "proposer": proposer, "max_new_tokens": MAX_NEW_TOKENS,
                           "prompts": {"name": "gsm8k-embedded", "num_prompts": NUM_PROMPTS}})


def _reference(case) -> dict:
    from specbench.run.external import reference_case
    from specbench.run.harness import run_case

    return run_case(reference_case(case), progress=False).to_dict()


def _vllm_as_given(case, speculative_config: dict, workdir) -> list[dict]:
    """vLLM's speculative run of ``case`` on ``speculative_config`` exactly as given (no translation): its
    per-request records."""
    from specbench.run.external import _prompts
    from specbench.engines.interface import Translation
    from specbench.engines.vllm_engine import execute, job

    prompts = [ids for _, ids in _prompts(case)[0]]
    output = execute(job(case, prompts, Translation(speculative_config), runs=("spec",)), workdir, case.case_id)
    return output["spec"]["requests"]


def _totals(requests: list[dict]) -> tuple[int, int, int]:
    return tuple(sum(r[key] for r in requests) for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))


def _write_eagle_copy(source, out_dir, *, keep_bias: bool) -> str:
    """The reference EAGLE-1 head without its fc bias ("bias": false), or as it is."""
    from safetensors.torch import load_file

    from specbench.eagle.checkpoint import write_head_directory

    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    tensors = load_file(source / "model.safetensors")
    if not keep_bias:
        config["bias"] = False
        del tensors["fc.bias"]
    write_head_directory(out_dir, config, tensors, "safetensors")
    return str(out_dir)


def _resolve(ref: str):
    from specbench.checkpoints.resolve import resolve_model_dir

    return resolve_model_dir(ref)


def test_eagle1_without_biases_is_exact(tmp_path, specbench_run):
    """A bias-free EAGLE-1 head is the one EAGLE-1 vLLM runs faithfully: outputs and counters identical."""
    skip_without_vllm()
    path = _write_eagle_copy(_resolve("specbench-ref/gsm8k-tiny-eagle"), tmp_path / "eagle1-bias-free", keep_bias=False)
    case = _case({"name": "eagle", "path": path, "num_speculative_tokens": 3}, "eagle1-bias-free-k3")
    result = specbench_run(case)
    conformance = result["correctness"]["conformance"]
    assert conformance["exact"] and conformance["counters_compared"], conformance["reason"]
    assert result["details"]["engine"]["known_divergences"] == []


def test_vllm_eagle1_bias_divergence(tmp_path):
    """vLLM builds EAGLE-1's fc without a bias and reads "bias": true as attention biases it leaves unset: the
    shipped head drafts almost nothing on vLLM (issue #26: acceptance 0.0092 against 0.5837), and no error says
    so. Asserts the divergence: this fails the day vLLM runs the head faithfully."""
    skip_without_vllm()
    path = str(_resolve("specbench-ref/gsm8k-tiny-eagle"))
    case = _case({"name": "eagle", "path": path, "num_speculative_tokens": 3}, "eagle1-as-shipped")
    vllm_drafts, vllm_tokens, vllm_accepted = _totals(_vllm_as_given(case, {"method": "eagle", "model": path,
                                                                             "num_speculative_tokens": 3}, tmp_path))
    reference = _reference(case)["metrics"]
    # half the reference's acceptance: far outside anything but a broken head (both runs are deterministic)
    assert vllm_accepted / vllm_tokens < reference["acceptance_rate"] / 2, (vllm_accepted, vllm_tokens, reference)


def test_vllm_medusa_old_layout_fails_to_load(tmp_path):
    """vLLM's MedusaConfig defaults hidden_size to 4096, so the old FasterDecoding layout (no hidden_size in its
    config.json) does not load: the weights are 256-wide. Asserts the failure: fails the day vLLM loads it."""
    from specbench.engines.vllm_engine import EngineFailed

    skip_without_vllm()
    path = str(_resolve("specbench-ref/gsm8k-tiny-medusa"))
    case = _case({"name": "medusa", "path": path, "num_speculative_tokens": 3}, "medusa-as-shipped")
    with pytest.raises(EngineFailed, match=r"Attempted to load weight \(torch.Size\(\[256, 256\]\)\) into parameter "
                                           r"\(torch.Size\(\[4096, 4096\]\)\)"):
        _vllm_as_given(case, {"method": "medusa", "model": path, "num_speculative_tokens": 3}, tmp_path / "vllm")


def test_vllm_medusa_drops_block_biases(tmp_path):
    """With hidden_size and vocab_size given but medusa_fc_bias left at vLLM's default (false), vLLM drops the old
    layout's block biases without a word: its counters are exactly those of specbench running the same heads with
    their biases zeroed, and differ from the heads' own (issue #26: acceptance 0.2702 against 0.2905). Fails the
    day vLLM keeps the biases."""
    import torch

    from specbench.checkpoints.medusa import read_medusa_checkpoint, write_medusa_checkpoint

    skip_without_vllm()
    heads = read_medusa_checkpoint(_resolve("specbench-ref/gsm8k-tiny-medusa"))
    translated = write_medusa_checkpoint(heads.config, heads.state_dict, tmp_path / "medusa-vllm", layout="vllm",
                                         base_model_name_or_path=REFERENCE)
    config = json.loads((translated / "config.json").read_text(encoding="utf-8"))
    config["medusa_fc_bias"] = False  # vLLM's default, as a config that names only the sizes has it
    (translated / "config.json").write_text(json.dumps(config), encoding="utf-8")
    zeroed = {key: torch.zeros_like(t) if key.endswith(".bias") else t for key, t in heads.state_dict.items()}
    without_bias = write_medusa_checkpoint(heads.config, zeroed, tmp_path / "medusa-zero-bias", layout="fasterdecoding",
                                           base_model_name_or_path=REFERENCE)
    case = _case({"name": "medusa", "path": str(translated), "num_speculative_tokens": 3}, "medusa-no-fc-bias")
    vllm = _vllm_as_given(case, {"method": "medusa", "model": str(translated), "num_speculative_tokens": 3},
                          tmp_path / "vllm")
    with_biases = _reference(case)["metrics"]
    zero_case = _case({"name": "medusa", "path": str(without_bias), "num_speculative_tokens": 3}, "medusa-zero-bias")
    zero = _reference(zero_case)
    assert [r["output_token_ids"] for r in vllm] == [r["output_token_ids"] for r in zero["requests"]]
    assert _totals(vllm) == _totals(zero["requests"]), "vLLM's counters are not those of bias-free heads"
    assert _totals(vllm) != (with_biases["num_drafts"], with_biases["num_draft_tokens"],
                             with_biases["num_accepted_tokens"]), "vLLM kept the biases: it is fixed"


def test_vllm_ngram_latest_match_diverges(tmp_path):
    """vLLM drafts after the earliest occurrence of the longest match; specbench's default (match = "latest") after
    the most recent: the counters differ on the reference prompts (issue #26: 2 of 10 requests), while the case with
    match = "earliest" is exact (conformance.toml). The verdict names the divergence instead of failing."""
    from specbench.run.harness import run_case

    skip_without_vllm()
    case = _case({"name": "ngram", "num_speculative_tokens": 3, "min_n": 1, "max_n": 3}, "ngram-latest-k3")
    result = run_case(case, progress=False).to_dict()
    conformance = result["correctness"]["conformance"]
    assert [d["name"] for d in conformance["known_divergences"]] == ["ngram-match"]
    assert conformance["exact"], conformance["reason"]  # the outputs, still compared, are identical
    reference = conformance["reference_metrics"]
    assert (result["metrics"]["num_drafts"], result["metrics"]["num_accepted_tokens"]) != (
        reference["num_drafts"], reference["num_accepted_tokens"]), "vLLM now drafts after the latest match"


def test_a_head_size_vllms_cpu_attention_refuses_is_one_clear_refusal(tmp_path):
    """vLLM's CPU attention refuses head_dim 16 deep inside its worker; the driver checks the shapes first, so the
    case ends with one refusal naming the model, its head size and the sizes vLLM takes, never a worker traceback."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specbench.engines.interface import EngineRefused
    from specbench.run.harness import run_case

    skip_without_vllm()
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "head-dim-16")
    case = _case({"name": "ngram", "num_speculative_tokens": 2, "match": "earliest"}, "head-dim-16")
    case.target, case.prompts, case.max_new_tokens = str(tmp_path / "head-dim-16"), {"name": "synthetic", "num_prompts": 1}, 4
    with pytest.raises(EngineRefused, match=r"vLLM's CPU attention does not take head_dim=16 \(the target .*head-dim-16: "
                                            r"hidden_size 64 / 4 heads\); it takes head sizes \[32, 64"):
        run_case(case, progress=False)
