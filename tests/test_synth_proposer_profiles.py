"""`specbench zoo synth`'s profile EAGLE-2 head, EAGLE-3 head and draft model: the miss plan along the cycle, the
heads loading through the strict loaders, and each one's acceptance, measured through the registered proposers and
the real verification against the synthetic target, within 2% of the published profile it was built to; and the
speed suite's cases over them: their loading, their skips, and the step-cost figures a run fills for them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specbench.cases.requirements import expand_ref, missing_checkpoint
from specbench.cases import find_case
from specbench.checkpoints.resolve import load_target_model
from specbench.cli import main
from specbench.eagle.checkpoint import load_eagle_head
from specbench.eagle.checkpoint3 import load_eagle3_head
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.metrics import SpecCounters
from specbench.proposers import create_proposer
from specbench.zoo.acceptance_profiles import (DRAFT_QWEN3_K3, EAGLE2_VICUNA_7B, EAGLE3_LLAMA_31_8B_K3, built_profile,
                                               check_profile, plan_segments)
from specbench.zoo.synth import NUM_SPECIAL_TOKENS, TINY_DRAFT_SHAPE

VOCAB, HIDDEN, LAYERS = 512, 64, 2  # the tiny shape
NUM_ORDINARY = VOCAB - NUM_SPECIAL_TOKENS
PROFILES = {"eagle": EAGLE2_VICUNA_7B, "eagle3": EAGLE3_LLAMA_31_8B_K3, "draft": DRAFT_QWEN3_K3}
# the settings the speed suite drafts each at: the depth its profile was built for (specbench/cases/speed.toml)
SETTINGS = {"eagle": ("eagle-profile", {"top_k": 8, "depth": 6, "total_tokens": 60}),
            "eagle3": ("eagle3-profile", {"num_speculative_tokens": 3}),
            "draft": ("draft-profile", {"num_speculative_tokens": 3})}
# one request walks most of the 509-token cycle: the walk keeps the profile of the stretch it covers, and only its
# first step (from wherever the prompt leaves it, inside a segment) and its last one (cut by max_new_tokens) differ
MAX_NEW_TOKENS = 440
PROMPT = torch.tensor([5, 17, 200, 33, 101, 7])


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("synth-proposers")
    assert main(["zoo", "synth", str(directory), "--tiny", "--device", "cpu"]) == 0
    return directory


@pytest.fixture(scope="module")
def record(synth_dir):
    return json.loads((synth_dir / "synth_record.json").read_text())


@pytest.fixture(scope="module")
def target_model(synth_dir):
    return load_target_model(str(synth_dir / "target"), dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def plain_output(target_model):
    config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    return Decoder(HFTarget(target_model), None, config).generate(PROMPT).output_token_ids


@pytest.mark.parametrize("num_ordinary", [NUM_ORDINARY, 32000 - NUM_SPECIAL_TOKENS])
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_plan_covers_the_cycle_and_keeps_the_profile(name, num_ordinary):
    """Segments tile the cycle exactly; over one walk around it, the share reaching each position is the profile
    up to the apportionment: each segment count is rounded (<= 1 segment per length) and at most D + 1 segments are
    moved one length to make the lengths add up, each moving one position's rate by 1 / S. S is ~117 (EAGLE-2) to
    ~197 (EAGLE-3) segments on the tiny cycle, so 0.01 bounds it there; ~7,400+ on the 7B's, so 0.001."""
    profile = PROFILES[name]
    segments = plan_segments(num_ordinary, profile)
    assert sum(a + 1 for a in segments) == num_ordinary
    assert set(segments) <= set(range(len(profile) + 1))
    built = built_profile(segments, len(profile))
    bound = 0.01 if num_ordinary == NUM_ORDINARY else 0.001
    assert max(abs(b - p) for b, p in zip(built, profile)) <= bound, (built, profile)


def test_the_record_holds_each_profile_and_its_directory(synth_dir, record):
    for name, (directory, _) in SETTINGS.items():
        entry = record[f"{name}_profile"]
        assert entry["path"] == str(synth_dir / directory) and (synth_dir / directory / "config.json").is_file()
        assert entry["requested_per_position_acceptance"] == list(PROFILES[name])
        assert entry["depth"] == len(PROFILES[name])
        built = entry["built_per_position_acceptance"]
        assert entry["expected_mean_acceptance_length"] == pytest.approx(1 + sum(built))
    assert record["draft_profile"]["shape"] == {**record["shape"], **TINY_DRAFT_SHAPE}
    assert not list(synth_dir.glob(".*"))  # no staging directory or record left behind


def test_the_heads_load_through_the_strict_loaders(synth_dir):
    eagle = load_eagle_head(synth_dir / "eagle-profile", target_hidden_size=HIDDEN, target_vocab_size=VOCAB)
    assert eagle.embed_tokens is not None and eagle.config.intermediate_size == 128  # one target layer's shape
    assert (synth_dir / "eagle-profile" / "pytorch_model.bin").is_file()  # the published EAGLE-1 file
    eagle3 = load_eagle3_head(synth_dir / "eagle3-profile", target_hidden_size=HIDDEN, target_vocab_size=VOCAB,
                              target_num_layers=LAYERS)
    assert eagle3.d2t is None and eagle3.config.draft_vocab_size == VOCAB  # no vocabulary map: the target's
    assert eagle3.fc.weight.shape == (HIDDEN, 3 * HIDDEN)  # three aux streams fused
    draft = json.loads((synth_dir / "draft-profile" / "config.json").read_text())
    assert draft["vocab_size"] == VOCAB and draft["num_hidden_layers"] == 1


def _target(engine: str, synth_dir, target_model):
    if engine == "eager":
        return HFTarget(target_model)
    from specbench.engine.static_target import StaticTarget  # the speed suite's engine, here without CUDA graphs

    return StaticTarget.from_pretrained(str(synth_dir / "target"), dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_measured_acceptance_is_the_published_profile(name, engine, synth_dir, target_model, plain_output):
    """Greedy (fp32) through the registered proposer and the engine's verification: the output equals plain
    decoding, and each position's acceptance rate is within 0.02 (absolute) of the profile the proposer was built
    to: the plan's own error (<= 0.01 above) plus the two edge steps of ~100 (<= 0.01)."""
    directory, options = SETTINGS[name]
    target = _target(engine, synth_dir, target_model)
    proposer = create_proposer(name, target, path=str(synth_dir / directory), **options)
    config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    result = Decoder(target, proposer, config).generate(PROMPT)
    assert result.output_token_ids == plain_output
    counters: SpecCounters = result.counters
    measured, profile = counters.per_position_acceptance_rate, PROFILES[name]
    assert len(measured) == len(profile) and counters.num_drafts > 60
    assert max(abs(m - p) for m, p in zip(measured, profile)) <= 0.02, (name, measured, profile)
    assert counters.mean_acceptance_length == pytest.approx(1 + sum(profile), abs=0.02 * len(profile))


@pytest.mark.parametrize("profile, found", [("0.5,0.7", "0.5 then 0.7"), ("1.5", "1.5")])
def test_a_bad_profile_exits_2_naming_flag_and_value_before_writing(tmp_path, capsys, profile, found):
    assert main(["zoo", "synth", str(tmp_path), "--tiny", "--device", "cpu", "--eagle3-acceptance", profile]) == 2
    err = capsys.readouterr().err
    assert "--eagle3-acceptance" in err and found in err
    assert not (tmp_path / "target").exists()


def test_check_profile_says_why_a_profile_is_refused():
    assert check_profile([0.9, 0.5], "--draft-acceptance") == (0.9, 0.5)
    with pytest.raises(ValueError, match=r"--draft-acceptance: .*must not increase .*position 2 .*0\.5 then 0\.9"):
        check_profile([0.5, 0.9], "--draft-acceptance")
    with pytest.raises(ValueError, match="--eagle-acceptance: give at least one"):
        check_profile([], "--eagle-acceptance")


# -- the speed suite's cases over the profile proposers (specbench/cases/speed.toml)

NEW_CASES = {"synth-7b-eagle2-dynamic": ("eagle", "eagle-profile"),
             "synth-7b-eagle3-chain-k3": ("eagle3", "eagle3-profile"), "synth-7b-draft-k3": ("draft", "draft-profile")}


@pytest.mark.parametrize("name", sorted(NEW_CASES))
def test_the_new_speed_cases_are_gated_as_the_medusa_7b_ones(name, monkeypatch):
    (case,) = find_case(f"speed/{name}")
    (medusa,) = find_case("speed/synth-7b-chain-k3")
    proposer, directory = NEW_CASES[name]
    assert case.proposer["name"] == proposer and case.proposer["path"] == f"${{SPECBENCH_SYNTH_DIR}}/{directory}"
    _, options = SETTINGS[proposer]
    assert {k: v for k, v in case.proposer.items() if k not in ("name", "path")} == options  # the profile's depth
    same = ("target", "prompts", "max_new_tokens", "dtype", "device", "engine", "ignore_eos", "repeats", "min_gpu_gib",
            "tolerances", "gate_speed", "gate_quality")
    assert {k: getattr(case, k) for k in same} == {k: getattr(medusa, k) for k in same}
    monkeypatch.setenv("SPECBENCH_SYNTH_DIR", "/data/synth-7b")
    assert expand_ref(case.proposer["path"], key="proposer.path") == f"/data/synth-7b/{directory}"


def test_without_the_variable_the_cases_skip_naming_it(monkeypatch):
    from specbench.pytest_plugin import skip_unless_available

    monkeypatch.delenv("SPECBENCH_SYNTH_DIR", raising=False)
    for name in NEW_CASES:
        (case,) = find_case(f"speed/{name}")
        with pytest.raises(pytest.skip.Exception, match=r"SPECBENCH_SYNTH_DIR, which is not set.*specbench zoo synth"):
            skip_unless_available(case)


def test_a_synth_dir_without_the_heads_skips_naming_the_missing_directory(tmp_path, monkeypatch, synth_dir):
    """A directory written before the profile heads existed: the message names the path and the command."""
    (tmp_path / "target").mkdir()
    monkeypatch.setenv("SPECBENCH_SYNTH_DIR", str(tmp_path))
    (case,) = find_case("speed/synth-7b-eagle3-chain-k3")
    message = missing_checkpoint(case)
    assert str(tmp_path / "eagle3-profile") in message and "does not exist" in message
    assert f"specbench zoo synth {tmp_path}`" in message
    monkeypatch.setenv("SPECBENCH_SYNTH_DIR", str(synth_dir))
    assert missing_checkpoint(case) is None


def test_a_run_fills_draft_cost_and_predicted_speedup(tmp_path, monkeypatch, synth_dir):
    """The three cases, shrunk to the CPU by overrides, through `specbench run`: lossless, with the step costs and the
    predicted speedup of each proposer measured (values are CPU timings, only their presence and sign are checked)."""
    monkeypatch.setenv("SPECBENCH_SYNTH_DIR", str(synth_dir))
    out = tmp_path / "run.json"
    assert main(["run", "speed", "-k", "eagle,draft", "--device", "cpu", "--dtype", "float32", "--max-new-tokens", "16",
                 "--num-prompts", "1", "--no-gate", "--no-history", "--output", str(out), "-q"]) == 0
    payload = json.loads(out.read_text())
    results = payload if isinstance(payload, list) else payload.get("results", [payload])
    assert sorted(r["case_id"].split("[")[0] for r in results) == sorted(f"speed/{n}" for n in NEW_CASES)
    for result in results:
        metrics = result["metrics"]
        for key in ("draft_cost_ratio", "verify_cost_ratio", "predicted_speedup", "decode_speedup"):
            assert math.isfinite(metrics[key]) and metrics[key] > 0, (result["case_id"], key, metrics[key])
