"""Explicit runs (`specbench run --proposer ... --prompts ...`) are named after the settings their command line
gave, as overridden stored cases are, so that two runs of different settings are never recorded as one case."""

from __future__ import annotations

from specbench.cli import build_parser
from specbench.cli.explicit_case import _explicit_case


def case_id(*argv: str) -> str:
    return _explicit_case(build_parser().parse_args(["run", *argv])).case_id


def test_runs_of_different_settings_are_different_cases():
    # the reported pair: both were recorded as cli/ngram
    first = case_id("--proposer", "ngram", "--num-speculative-tokens", "2", "--prompts", "gsm8k")
    second = case_id("--proposer", "ngram", "--num-speculative-tokens", "5", "--num-prompts", "6",
                     "--max-new-tokens", "32", "--prompts", "gsm8k")
    assert first == "cli/ngram[num_speculative_tokens=2,prompts=gsm8k]"
    assert second == "cli/ngram[num_speculative_tokens=5,prompts=gsm8k,max_new_tokens=32,num_prompts=6]"


def test_the_same_settings_are_the_same_case():
    argv = ("--proposer", "ngram", "--num-speculative-tokens", "3", "--prompts", "mt_bench", "--temperature", "0.7")
    assert case_id(*argv) == case_id(*argv) == "cli/ngram[num_speculative_tokens=3,prompts=mt_bench,temperature=0.7]"


def test_references_and_paths_are_named_without_slashes(tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    assert case_id("--prompts", "spec_bench/coding") == "cli/medusa[prompts=spec_bench:coding]"
    assert case_id("--proposer", "ngram", "--num-speculative-tokens", "2", "--prompts", str(prompts)) == \
        "cli/ngram[num_speculative_tokens=2,prompts=mine.jsonl]"  # a local file by its own name


def test_name_still_wins():
    assert case_id("--proposer", "ngram", "--num-speculative-tokens", "2", "--prompts", "gsm8k",
                   "--name", "mine") == "cli/mine"
