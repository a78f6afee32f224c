"""bench/host_cost.py: the decode loop's cost per plain step with free replays (a CPU smoke test of the bench)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import host_cost  # noqa: E402

from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402


def test_free_replays_still_run_the_loop_and_print_its_cost(capsys):
    assert host_cost.main(["--new-tokens", "6", "--batch-size", "2", "--repeats", "1"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"loop cost per plain step, free replays, B = 2: [0-9.]+ us \(median of 1; min [0-9.]+ us\)", line)


def test_a_free_replay_captures_once_and_never_runs_the_forward_again():
    target = host_cost.tiny_target(1)
    result = Decoder(target, None, GenerationConfig(max_new_tokens=5, ignore_eos=True)).generate(torch.arange(10))
    assert len(result.output_token_ids) == 5
    assert sum(target.graphs.captures.values()) == len(target.graphs.captured)  # each key captured once
    assert sum(target.graphs.replays.values()) >= 4  # every step after the first token replayed a free graph


@pytest.mark.parametrize("proposer", ["medusa-chain", "eagle2", "draft"])
def test_speculative_steps_queued_ahead_are_timed_and_named(capsys, proposer):
    """These options need no data directory (the Medusa tree loads the published mc_sim_7b_63 from it)."""
    assert host_cost.main(["--new-tokens", "6", "--repeats", "1", "--proposer", proposer, "--queue-ahead"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"loop cost per {proposer} (queued ahead) step, free replays, B = 1: "), line
