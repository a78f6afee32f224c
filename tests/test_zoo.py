"""The zoo build end to end at miniature scale on CPU (tokenizer, target, Medusa heads, trees, draft,
build record), its registry of short names, and installing a build atomically."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from specbench.checkpoints.medusa import read_medusa_checkpoint
from specbench.medusa.checkpoint import load_medusa_heads
from specbench.medusa.trees import load_tree
from specbench.references import ReferenceMissing, reference_names, resolve_reference
from specbench.zoo.build import _checks, build_zoo
from specbench.zoo.cli import add_zoo_subcommand, cmd_build, main
from specbench.zoo.build_record import RECORD_FILE, RECORD_KEYS, read_record
from specbench.zoo.config import FULL, TEST
from specbench.prompts.gsm8k import SPLIT_FILES, read_split
from specbench.references import DATA_DIR_ENV
from specbench.zoo.corpus import document_text, prompt_text
from specbench.references import REFERENCES, ZOO_DIR_ENV
from specbench.zoo.registry import install_build

DATA_DIR = os.environ.get(DATA_DIR_ENV)


def _data_skip_reason() -> str | None:
    if not DATA_DIR:
        return f"{DATA_DIR_ENV} is unset; point it at a directory holding {SPLIT_FILES['train']} and {SPLIT_FILES['test']}"
    missing = [rel for rel in SPLIT_FILES.values() if not (Path(DATA_DIR) / rel).is_file()]
    return f"{DATA_DIR_ENV}={DATA_DIR} lacks {missing}" if missing else None


needs_data = pytest.mark.skipif(_data_skip_reason() is not None, reason=_data_skip_reason() or "")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """One miniature build shared by the tests of this module: ``OUT_DIR/gsm8k-tiny``."""
    if _data_skip_reason():
        pytest.skip(_data_skip_reason())
    out = tmp_path_factory.mktemp("zoo")
    return build_zoo(out, TEST, scale="test", data_dir=DATA_DIR, device="cpu", seed=0, progress=False)


@needs_data
def test_build_record_holds_every_field(built):
    record = read_record(built)
    assert set(RECORD_KEYS) <= set(record)
    assert record["status"] == "complete" and record["seed"] == 0 and record["scale"] == "test"
    train_file = Path(DATA_DIR) / SPLIT_FILES["train"]
    assert record["data"]["train"]["sha256"] == hashlib.sha256(train_file.read_bytes()).hexdigest()
    for library in ("torch", "transformers", "tokenizers", "safetensors"):
        assert record["libraries"][library], library
    assert record["target"]["steps"] == TEST.target_training.steps
    assert record["draft"]["steps"] == TEST.draft_training.steps
    assert record["medusa"]["steps"] == TEST.heads_steps
    for stage in ("target", "medusa", "draft"):
        assert 0 < len(record[stage]["loss_curve"]) <= 100 and record[stage]["final_loss"] > 0
    top1, top5 = record["medusa"]["top1_accuracy"], record["medusa"]["top5_accuracy"]
    assert len(top1) == len(top5) == TEST.medusa_num_heads
    # top-5 is cumulative, so it can never be below top-1; both are shares
    assert all(0.0 <= a <= b <= 1.0 for a, b in zip(top1, top5))
    for size in TEST.tree_sizes:
        tree = record["trees"][str(size)]
        # 1 (the bonus token) + expected accepted tokens, at most one per head on a path
        assert tree["num_nodes"] == size and 1.0 <= tree["expected_mean_acceptance_length"] <= 1 + TEST.medusa_num_heads
        measured = record["acceptance"][f"tree_{size}"]
        assert 1.0 <= measured["mean_acceptance_length"] <= 1 + TEST.medusa_num_heads
        # greedy verification in fp32 is lossless: a tree must emit the chain's tokens exactly
        assert measured["outputs_match_first"] is True
    assert 0.0 <= record["acceptance"][f"chain_k{TEST.eval_chain_k}"]["acceptance_rate"] <= 1.0
    sizes = record["sizes_bytes"]
    assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total") > 0
    assert record["wall_time_s"]["total"] > 0 and record["passed"] is True and record["checks"] == {}


@needs_data
def test_outputs_load_with_auto_classes(built):
    for part in ("target", "draft"):
        tokenizer = AutoTokenizer.from_pretrained(built / part)
        assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
        assert tokenizer.eos_token_id != tokenizer.pad_token_id
        model = AutoModelForCausalLM.from_pretrained(built / part, dtype=torch.float32)
        assert model.config.vocab_size == len(tokenizer)
        assert model.config.eos_token_id == tokenizer.eos_token_id
        with safe_open(str(built / part / "model.safetensors"), "pt") as weights:
            stored = {weights.get_slice(key).get_dtype() for key in weights.keys()}
        assert stored == {"BF16"}  # stored in bf16: the zoo must stay small
    text = "Question: Tom has 3 apples.\nAnswer: 3 + 4 = <<3+4=7>>7\n#### 7"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level BPE round-trips any text


@needs_data
def test_prompts_are_prefixes_of_training_documents(built):
    tokenizer = AutoTokenizer.from_pretrained(built / "target")
    for record in read_split(DATA_DIR, "train").records[: TEST.num_train_records]:
        prompt = tokenizer(prompt_text(record["question"]))["input_ids"]
        document = tokenizer(document_text(record))["input_ids"]
        assert document[: len(prompt)] == prompt, record["question"][:60]


# GSM8K test record 1 (openai/grade-school-math, MIT), written out by hand: its double space
# after "fiber." and its newlines must survive the formatting unchanged
ROBE_QUESTION = "A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total does it take?"
ROBE_ANSWER = "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 bolts of fabric\n#### 3"


def test_prompt_text_is_the_zero_shot_gsm8k_prompt():
    expected_prompt = (
        "Question: A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total "
        "does it take?\nAnswer:"
    )
    assert prompt_text(ROBE_QUESTION) == expected_prompt
    document = document_text({"question": ROBE_QUESTION, "answer": ROBE_ANSWER})
    # the training document is the prompt, one space, then the worked answer: nothing in between
    assert document == prompt_text(ROBE_QUESTION) + " " + ROBE_ANSWER
    assert document == (
        expected_prompt + " It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is "
        "2+1=<<2+1=3>>3 bolts of fabric\n#### 3"
    )
    assert document.startswith(prompt_text(ROBE_QUESTION)) and document[len(expected_prompt)] == " "


@needs_data
def test_prompt_text_is_what_the_gsm8k_prompt_set_feeds_zero_shot(monkeypatch):
    """The zoo trains on the format the suites evaluate with: load_prompts("gsm8k", n_shot=0)
    gives, for test record 1, exactly the zoo's prompt_text of the same question."""
    from specbench.prompts import load_prompts

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local copy, never a download
    prompt_set = load_prompts("gsm8k", num_prompts=2, n_shot=0, data_dir=DATA_DIR)
    assert prompt_set.prompts[1].text == prompt_text(ROBE_QUESTION)


@needs_data
def test_medusa_heads_are_saved_in_the_old_fasterdecoding_layout(built):
    config = json.loads((built / "medusa" / "config.json").read_text())
    assert "model_type" not in config
    assert config == {"base_model_name_or_path": "specbench-ref/gsm8k-tiny", "medusa_num_heads": TEST.medusa_num_heads,
                      "medusa_num_layers": TEST.medusa_num_layers}
    with safe_open(str(built / "medusa" / "medusa_lm_head.safetensors"), "pt") as weights:
        keys = set(weights.keys())
    expected = {f"{h}.0.linear.weight" for h in range(TEST.medusa_num_heads)} | {f"{h}.0.linear.bias" for h in range(TEST.medusa_num_heads)}
    expected |= {f"{h}.1.weight" for h in range(TEST.medusa_num_heads)}
    assert keys == expected
    target = AutoModelForCausalLM.from_pretrained(built / "target")
    heads = load_medusa_heads(built / "medusa", hidden_size=target.config.hidden_size, vocab_size=target.config.vocab_size)
    assert heads.config.num_heads == TEST.medusa_num_heads
    assert read_medusa_checkpoint(built / "medusa").layout == "fasterdecoding"


@needs_data
def test_trees_load_and_fit_the_heads(built):
    for size in TEST.tree_sizes:
        tree = load_tree(built / "trees" / f"gsm8k-tiny-{size}.json")
        assert tree.num_nodes == size and tree.max_depth <= TEST.medusa_num_heads and tree.top_k <= TEST.tree_top_k


@needs_data
def test_rebuild_with_the_same_seed_gives_identical_target_weights(built, tmp_path):
    # later stages do not touch the target, so they are cut short to keep the rebuild cheap
    cheap_tail = dataclasses.replace(
        TEST, heads_steps=1, num_answer_prefix_prompts=0, eval_num_prompts=1,
        draft_training=dataclasses.replace(TEST.draft_training, steps=1),
    )
    rebuilt = build_zoo(tmp_path, cheap_tail, data_dir=DATA_DIR, device="cpu", seed=0, progress=False)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (rebuilt / "target" / name).read_bytes() == (built / "target" / name).read_bytes(), name


@needs_data
def test_a_failed_build_leaves_nothing_behind(tmp_path):
    with pytest.raises(FileNotFoundError, match="gsm8k/train.jsonl"):
        build_zoo(tmp_path / "out", TEST, data_dir=tmp_path / "no-data", device="cpu", progress=False)
    assert list((tmp_path / "out").iterdir()) == []


@needs_data
def test_build_refuses_to_overwrite_without_flag(built, capsys):
    code = main(["build", str(built.parent), "--scale", "test", "--device", "cpu", "--data-dir", DATA_DIR, "-q"])
    assert code == 2
    assert f"{built} already exists" in capsys.readouterr().err


def test_registry_error_names_the_missing_path_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv(ZOO_DIR_ENV, str(tmp_path))
    for name in reference_names():
        with pytest.raises(ReferenceMissing) as error:
            resolve_reference(name)
        message = str(error.value)
        assert str(tmp_path / "gsm8k-tiny" / REFERENCES[name]) in message
        assert "specbench zoo build" in message
    assert resolve_reference("lmsys/vicuna-7b-v1.3") is None  # not a zoo name: callers go on to the hub


@needs_data
def test_registry_resolves_a_build_directory(built, monkeypatch):
    monkeypatch.setenv(ZOO_DIR_ENV, str(built.parent))
    assert resolve_reference("specbench-ref/gsm8k-tiny") == built / "target"
    assert resolve_reference("specbench-ref/gsm8k-tiny-medusa") == built / "medusa"
    assert resolve_reference("specbench-ref/gsm8k-tiny-draft") == built / "draft"
    assert resolve_reference("gsm8k-tiny-63") == built / "trees" / "gsm8k-tiny-63.json"
    assert resolve_reference("gsm8k-tiny-15") == built / "trees" / "gsm8k-tiny-15.json"


@needs_data
def test_install_copies_a_build_and_refuses_a_failed_one(built, tmp_path):
    artifacts = tmp_path / "artifacts"
    installed = install_build(built.parent, artifacts_dir=artifacts)
    assert installed == artifacts / "gsm8k-tiny"
    assert (installed / "medusa" / "medusa_lm_head.safetensors").read_bytes() == (built / "medusa" / "medusa_lm_head.safetensors").read_bytes()
    assert all(path.stat().st_mode & 0o444 == 0o444 for path in installed.rglob("*"))  # readable by every user
    assert [p.name for p in artifacts.iterdir()] == ["gsm8k-tiny"]  # no staging left over

    failed = tmp_path / "failed" / "gsm8k-tiny"
    failed.parent.mkdir()
    shutil.copytree(built, failed)
    record = read_record(failed)
    record.update(passed=False, checks={"chain_k3_acceptance>=0.25": False})
    (failed / RECORD_FILE).write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"chain_k3_acceptance>=0\.25"):
        install_build(failed, artifacts_dir=artifacts)
    assert install_build(failed, artifacts_dir=artifacts, force=True) == installed  # replaces the earlier install
    assert read_record(installed)["passed"] is False


def test_full_scale_checks_follow_the_config():
    acceptance = {"chain_k3": {"acceptance_rate": 0.24}, "tree_63": {"mean_acceptance_length": 2.4}}
    checks = _checks(FULL, acceptance, total_bytes=21_000_000, largest_tree="63")
    assert checks == {"chain_k3_acceptance>=0.25": False, "tree_63_mean_acceptance_length>=2.3": True, "total_bytes<=50000000": True}
    assert _checks(TEST, acceptance, total_bytes=10**9, largest_tree="7") == {}  # the miniature gates nothing


def test_data_errors_name_the_path_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=f"--data-dir or set {DATA_DIR_ENV}"):
        read_split(None, "train")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "gsm8k" / "test.jsonl")):
        read_split(tmp_path, "test")
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match=r"test.jsonl, line 1: key 'answer' must be a string"):
        read_split(tmp_path, "test")


def test_zoo_subcommand_wires_into_a_cli_parser():
    parser = argparse.ArgumentParser(prog="specbench")
    add_zoo_subcommand(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["zoo", "build", "OUT", "--scale", "test", "--device", "cpu", "--target-steps", "5", "--install"])
    assert args.func is cmd_build and args.out_dir == "OUT" and args.target_steps == 5 and args.install


def test_compare_checks_a_rebuild_against_the_tolerance_its_record_states(tmp_path, capsys):
    import copy

    from specbench.cli import main
    from specbench.zoo.build_record import compare_records, read_record
    from specbench.references import references_root

    shipped = read_record(references_root() / "gsm8k-tiny")  # a CUDA build: 5% for the quality metrics
    rebuild = copy.deepcopy(shipped)
    rebuild["acceptance"]["chain_k3"]["acceptance_rate"] *= 1.04
    rebuild["reproducibility"] = {"cuda_quality_tolerance": 0.05, "metrics": [
        "acceptance.chain_k3.acceptance_rate", "acceptance.tree_63.mean_acceptance_length"]}
    verdict = compare_records(shipped, rebuild)
    assert verdict["reproduced"] and verdict["tolerance"] == 0.05
    assert verdict["rows"][0]["relative_change"] == pytest.approx(0.04)

    rebuild["acceptance"]["tree_63"]["mean_acceptance_length"] *= 0.94  # 6% lower: outside 5%
    record_file = tmp_path / "build_record.json"
    record_file.write_text(json.dumps(rebuild))
    assert main(["zoo", "compare", str(record_file)]) == 1
    out = capsys.readouterr().out
    assert "FAIL acceptance.tree_63.mean_acceptance_length" in out and "(-6.0%)" in out and "NOT reproduced" in out

    cpu_a, cpu_b = copy.deepcopy(rebuild), copy.deepcopy(rebuild)
    cpu_a["device"] = cpu_b["device"] = "cpu"
    cpu_b["acceptance"]["chain_k3"]["acceptance_rate"] *= 1.001  # CPU builds are bit-identical: any change fails
    assert compare_records(cpu_a, cpu_b)["tolerance"] == 0.0 and not compare_records(cpu_a, cpu_b)["reproduced"]

    other_seed = dict(rebuild, seed=1)
    with pytest.raises(ValueError, match="rebuild has seed 1 but reference has 0"):
        compare_records(shipped, other_seed)
