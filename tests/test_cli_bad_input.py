"""Bad input to the command line is one line on stderr naming the file (or flag) and what to do, exit
status 2, never a traceback: truncated checkpoints, garbage tokenizers, damaged prompt and baseline files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _cli_output import error_line

from specbench.cli import main
from specbench.report.arguments import one_line

ARTIFACTS = Path(__file__).resolve().parent.parent / "specbench" / "zoo" / "artifacts" / "gsm8k-tiny"
SMALL = ["--num-prompts", "1", "--max-new-tokens", "4", "-q", "--no-history"]


def copied_model(tmp_path, name: str) -> Path:
    directory = tmp_path / name
    shutil.copytree(ARTIFACTS / name, directory)
    return directory


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_target_checkpoint_is_one_line_naming_the_file(tmp_path, capsys):
    target = copied_model(tmp_path, "target")
    truncate(target / "model.safetensors")
    assert main(["run", "--target", str(target), "--proposer", "ngram", "--num-speculative-tokens", "2",
                 "--prompts", "gsm8k-embedded", *SMALL]) == 2
    line = error_line(capsys)
    assert line.startswith(f"specbench: error: {target / 'model.safetensors'}: ")


def test_a_loader_error_naming_no_file_is_traced_to_the_file(tmp_path, capsys, monkeypatch):
    """transformers' own error for a truncated file (a SafetensorError naming no file) still becomes one line
    naming the file, whatever the loader in front of it checks first."""
    from safetensors import SafetensorError

    target = copied_model(tmp_path, "target")
    truncate(target / "model.safetensors")

    def transformers_like(*_, **__):
        raise SafetensorError("Error while deserializing header: incomplete metadata, file not fully covered")

    monkeypatch.setattr("specbench.checkpoints.resolve.load_target_model", transformers_like)
    assert main(["run", "--target", str(target), "--proposer", "ngram", "--num-speculative-tokens", "2",
                 "--prompts", "gsm8k-embedded", *SMALL]) == 2
    line = error_line(capsys)
    assert line.startswith(f"specbench: error: {target / 'model.safetensors'}: truncated: header says ")
    assert line.endswith("; re-download it, re-export it, or check the copy (case cli/ngram[target=target,"
                         "num_speculative_tokens=2,prompts=gsm8k-embedded,max_new_tokens=4,num_prompts=1])")


def test_a_garbage_tokenizer_is_one_line_naming_the_file(tmp_path, capsys):
    target = copied_model(tmp_path, "target")
    (target / "tokenizer.json").write_text("{not json")
    assert main(["run", "--target", str(target), "--proposer", "ngram", "--num-speculative-tokens", "2",
                 "--prompts", "gsm8k-embedded", *SMALL]) == 2
    assert error_line(capsys) == (
        f"specbench: error: {target / 'tokenizer.json'}: not valid JSON (Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)); re-download or re-export the model (case cli/ngram[target=target,"
        "num_speculative_tokens=2,prompts=gsm8k-embedded,max_new_tokens=4,num_prompts=1])")


def test_truncated_medusa_heads_are_one_line_naming_the_file(tmp_path, capsys):
    heads = copied_model(tmp_path, "medusa")
    (weights,) = [p for p in heads.iterdir() if p.suffix in (".safetensors", ".pt")]
    truncate(weights)
    assert main(["run", "--proposer-path", str(heads), "--num-speculative-tokens", "3", "--prompts", "gsm8k-embedded",
                 *SMALL]) == 2
    assert str(weights) in error_line(capsys)


def test_calibrate_tree_on_a_truncated_target_is_one_line_naming_the_file(tmp_path, capsys):
    target = copied_model(tmp_path, "target")
    truncate(target / "model.safetensors")
    assert main(["calibrate-tree", "--target", str(target), "--medusa", "specbench-ref/gsm8k-tiny-medusa",
                 "--prompts", "gsm8k-embedded", "--num-prompts", "1", "--max-new-tokens", "4",
                 "--output", str(tmp_path / "t.json"), "-q"]) == 2
    assert str(target / "model.safetensors") in error_line(capsys)


def test_calibrate_tree_values_are_checked(capsys):
    assert main(["calibrate-tree", "--target", "t", "--medusa", "m", "--prompts", "p", "--nodes", "0",
                 "--output", "o.json"]) == 2
    assert error_line(capsys) == ("specbench calibrate-tree: error: argument --nodes: expected an integer >= 1, "
                                  "got '0' (see `specbench calibrate-tree --help`)")


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a"}\n{nope\n', "{path}, line 2: invalid JSON"),
    (b"\xff\xfe\x00garbage", "{path}: not UTF-8 text"),
])
def test_a_damaged_prompt_file_is_one_line_naming_the_file(tmp_path, capsys, content, message):
    path = tmp_path / "p.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["run", "--target", "specbench-tiny/random-llama", "--proposer", "ngram", "--prompts", str(path),
                 *SMALL]) == 2
    assert error_line(capsys).startswith("specbench: error: " + message.format(path=path))


def test_a_corrupt_baseline_file_is_one_line(tmp_path, capsys):
    (tmp_path / "medusa.json").write_text("{broken")
    assert main(["baselines", "show", "--baselines", str(tmp_path)]) == 2
    assert error_line(capsys).startswith(f"specbench: error: {tmp_path / 'medusa.json'}: not valid JSON")


def test_os_errors_and_multi_line_messages_become_one_line():
    from specbench.checkpoints.resolve import ModelUnavailable

    assert one_line(PermissionError(13, "Permission denied", "/m/config.json")) == (
        "/m/config.json: Permission denied; check the path and its permissions")
    message = one_line(ModelUnavailable("org/name", "not in the HF cache", tried=["local directory /x (absent)"]))
    assert "\n" not in message
    assert message.startswith("model 'org/name' is unavailable: not in the HF cache; tried: local directory /x (absent); to fix:")
