"""The static engine against the eager reference on random cases (tests/_random_trials.py): 41 fixed seeds on every
run, most of the greedy ones with the GPU's steps queued ahead, half through captured steps replayed as recorded
(tests/_op_tape.py); a soak over as many seeds as fit ``SPECBENCH_SOAK_SECONDS`` (from ``SPECBENCH_SOAK_SEED``,
default 1000), with ``SPECBENCH_SOAK_COMPILE=1`` through the compiled stages (``=draft``: EAGLE's whole draft steps
compiled too, ``eagle/captured.COMPILE_DRAFT``), when asked."""

from __future__ import annotations

import os
import time

import pytest

from _random_trials import KINDS, TIE, draw, queues_ahead, run_trial
from specbench.eagle import captured


SEEDS = [*range(40), 77]  # 77: the first draft-model case that queues ahead (greedy, greedy drafts, asked to)


def test_the_fixed_seeds_draw_every_proposer_batch_shape_and_acceptance_rule():
    cases = [draw(seed) for seed in SEEDS]
    assert {c["kind"] for c in cases} == set(KINDS)
    assert any(c["batch_size"] > len(c["prompts"]) for c in cases)  # idle slots from the start
    assert any(1 < c["batch_size"] < len(c["prompts"]) for c in cases)  # slots refilled mid-run
    sampled = [c["sampling"] for c in cases if c["sampling"]]
    assert {s["acceptance"] for s in sampled} == {"auto", "typical"}  # lossless rejection sampling and Medusa's rule
    ahead = {c["kind"] for c in cases if queues_ahead(c)}
    assert ahead == set(KINDS) - {"ngram"}, ahead  # every proposer that can queue ahead does in some case
    assert {c["kind"] for c in cases if c["graphs"]} == set(KINDS)  # and every one runs through captured steps


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_case_decodes_as_the_eager_reference(seed):
    observed, case = [], draw(seed)
    assert run_trial(seed, observed=observed) is None
    ahead, replays = observed
    assert ahead == queues_ahead(case)  # the production path (GPU: steps queued ahead) where drawn
    assert (replays > 0) == case["graphs"]  # and its graphs: captured steps replayed with their Python frozen


@pytest.mark.skipif(not os.environ.get("SPECBENCH_SOAK_SECONDS"), reason="a soak: set SPECBENCH_SOAK_SECONDS (and "
                    "optionally SPECBENCH_SOAK_SEED, SPECBENCH_SOAK_COMPILE=1 or draft) to run random cases for that long")
def test_soak(monkeypatch):
    seed = int(os.environ.get("SPECBENCH_SOAK_SEED", "1000"))
    end = time.monotonic() + float(os.environ["SPECBENCH_SOAK_SECONDS"])
    mode, failures, ties, trials = os.environ.get("SPECBENCH_SOAK_COMPILE"), [], 0, 0
    compile = mode in ("1", "draft")
    monkeypatch.setattr(captured, "COMPILE_DRAFT", mode == "draft")
    while time.monotonic() < end:
        outcome = run_trial(seed + trials, compile=compile)
        ties += outcome == "tie"
        failures += [outcome] if outcome not in (None, "tie") else []
        trials += 1
    print(f"{trials} random cases from seed {seed}: {len(failures)} differed, {ties} parted at a tie of the "
          f"reference's logits (within {TIE})")
    assert not failures, "\n".join(failures)
