"""Cases at tensor_parallel = 2 on the CPU (gloo): the harness launches the ranks, the result equals the
single-process one token for token, its env names every rank, the CLI flag runs it, bad inputs are refused
naming the case, key and value, and a failing rank fails the case leaving no process behind."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
import torch

from specbench.cases import Case, find_case, with_overrides
from specbench.cli import main
from specbench.distributed import TensorParallelCaseError
from specbench.run.harness import run_case
from specbench.run.tensor_parallel import case_on_rank, run_tensor_parallel_case
from test_tensor_parallel import _descendants

SETTINGS = {"engine": "static", "num_prompts": 3, "max_new_tokens": 24}  # medusa/chain-k3: K=3 on gsm8k-tiny
CLI = ["run", "medusa/chain-k3", "--engine", "static", "--num-prompts", "3", "--max-new-tokens", "24", "-q",
       "--no-history"]
SAME_METRICS = ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance_rate", "num_drafts",
                "num_draft_tokens", "num_accepted_tokens", "num_output_tokens")
REQUEST_FIELDS = ("prompt_id", "output_token_ids", "plain_output_token_ids", "num_drafts", "num_draft_tokens",
                  "num_accepted_tokens", "accepted_per_position")


def chain_case(**settings) -> Case:
    (stored,) = find_case("medusa/chain-k3")
    return with_overrides(stored, {**SETTINGS, **settings})[0]


@contextlib.contextmanager
def one_thread():
    """The single-process run on one core, as each of the two ranks gets (2 cores: no oversubscription)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def unset() -> dict:
    with one_thread():
        return run_case(chain_case(), progress=False).to_dict()


@pytest.fixture(scope="module")
def tp2_cli(tmp_path_factory) -> tuple[int, str, dict]:
    """`specbench run ... --tensor-parallel 2 --output r.json`: the CLI runs the case, the harness launches two ranks."""
    path = tmp_path_factory.mktemp("tp2") / "r.json"
    code, out, err = cli([*CLI, "--tensor-parallel", "2", "--output", str(path)])
    assert code == 0, out + err
    return code, out, json.loads(path.read_text())


def assert_same_run(sharded: dict, alone: dict) -> None:
    """A sharded run's result equals the one-process run's: 3 requests of 24 tokens each, the same request fields
    and metrics, drafts made, lossless."""
    assert len(sharded["requests"]) == len(alone["requests"]) == 3
    for got, want in zip(sharded["requests"], alone["requests"]):
        assert {k: got[k] for k in REQUEST_FIELDS} == {k: want[k] for k in REQUEST_FIELDS}
        assert len(got["output_token_ids"]) == 24
    assert {k: sharded["metrics"][k] for k in SAME_METRICS} == {k: alone["metrics"][k] for k in SAME_METRICS}
    assert sharded["metrics"]["num_drafts"] > 0
    assert sharded["correctness"]["checked"] and sharded["correctness"]["exact"]


def test_tp2_case_equals_the_unset_case_token_for_token(unset, tp2_cli):
    _, _, tp2 = tp2_cli
    assert tp2["case"]["tensor_parallel"] == 2 and "tensor_parallel" not in unset["case"]  # unset: the dict of before
    assert_same_run(tp2, unset)


def test_tp2_step_costs_are_measured_on_the_ranks(tp2_cli):
    _, _, tp2 = tp2_cli
    (repeat,) = tp2["repeats"]
    assert repeat["t1_s"] > 0 and repeat["verify_s"] > 0 and repeat["verify_width"] == 4
    assert tp2["metrics"]["predicted_speedup"] is not None


def test_tp2_env_names_every_rank(unset, tp2_cli):
    _, _, tp2 = tp2_cli
    env = tp2["env"]
    assert (env["world_size"], env["tensor_parallel"], env["backend"]) == (2, 2, "gloo")
    assert len(env["device_names"]) == 2 and all(env["device_names"])
    assert env["interconnect"] == "none (CPU, gloo)"
    assert env["hardware_class"] == unset["env"]["hardware_class"] == "cpu"  # CPU baselines keep their class
    assert "world_size" not in unset["env"] and "device_names" not in unset["env"]


def test_cli_tensor_parallel_prints_its_table(tp2_cli):
    code, out, _ = tp2_cli
    row = next(line for line in out.splitlines() if line.startswith("medusa/chain-k3["))
    assert "tensor_parallel=2" in row and row.rstrip().endswith("exact")
    assert code == 0


@pytest.mark.parametrize("value, message", [
    (0, r"tensor_parallel must be an integer >= 1 \(ranks the target is sharded over\), found 0"),
    ("2", r"tensor_parallel must be an integer >= 1 .*found '2'"),
    (True, r"tensor_parallel must be an integer >= 1 .*found True"),
])
def test_a_tensor_parallel_that_is_not_a_positive_int_is_refused(value, message):
    with pytest.raises(ValueError, match=message):
        Case.from_dict({"name": "tp", "engine": "static", "tensor_parallel": value})


def test_tensor_parallel_needs_the_static_engine():
    with pytest.raises(ValueError, match=r"case 'tp'\): tensor_parallel = 2 shards the static engine's target, and "
                                         r"the case has engine = 'eager'; set engine = \"static\" \(--engine static\)"):
        Case.from_dict({"name": "tp", "tensor_parallel": 2})


@pytest.mark.parametrize("key, value", [("batch_size", 2), ("batch_sizes", [1, 2])])
def test_tensor_parallel_is_not_combined_with_batching(key, value):
    with pytest.raises(ValueError, match=rf"case 'tp'\): tensor_parallel = 2 cannot be combined with {key} = "
                                         r".* yet \(the batched engine is not sharded\); drop one of them"):
        Case.from_dict({"name": "tp", "engine": "static", "tensor_parallel": 2, key: value})


def test_heads_that_do_not_divide_are_refused_before_any_rank_starts():
    case = Case.from_dict({"name": "tp4", "engine": "static", "tensor_parallel": 4})  # random-llama: 4 heads, 2 KV
    before = {pid for pid, _ in _descendants(os.getpid())}
    with pytest.raises(ValueError, match=r"case adhoc/tp4 at tensor_parallel = 4: target 'specbench-tiny/random-llama'"
                                         r": cannot shard .* 2 key/value heads do not divide by 4.*\(1, 2\); set "
                                         r"tensor_parallel \(--tensor-parallel N\)"):
        run_case(case, progress=False)
    assert {pid for pid, _ in _descendants(os.getpid())} <= before


@pytest.mark.parametrize("flag, expected", [
    (["--tensor-parallel", "0"], "argument --tensor-parallel: expected an integer >= 1 (ranks the target is sharded "
                                 "over), got '0'"),
    (["--tensor-parallel", "two"], "argument --tensor-parallel: expected an integer >= 1"),
])
def test_cli_refuses_a_bad_tensor_parallel(flag, expected):
    code, _, err = cli(["run", "medusa/chain-k3", *flag])
    assert code == 2 and expected in err


def test_cli_tensor_parallel_on_an_eager_case_says_what_to_set():
    code, _, err = cli(["run", "medusa/chain-k3", "--tensor-parallel", "2", "--no-history"])
    assert code == 2
    assert "tensor_parallel = 2 shards the static engine's target" in err and "--engine static" in err


def broken_rank_one(context, case, progress):
    """A launched rank whose shard cannot be loaded on rank 1 (rank 0 runs the real body and waits on it)."""
    if context.rank == 1:
        raise ValueError("rank 1 cannot load its shard: deliberately broken")
    return case_on_rank(context, case, progress)


def test_a_failing_rank_fails_the_case_with_its_message_and_leaves_no_process():
    before = {pid for pid, _ in _descendants(os.getpid())}
    case = chain_case(tensor_parallel=2)
    with pytest.raises(TensorParallelCaseError, match=r"case medusa/chain-k3\[.*\] at tensor_parallel = 2: rank 1 "
                                                      r"failed: ValueError: rank 1 cannot load its shard") as error:
        run_tensor_parallel_case(case, progress=False, rank_main=broken_rank_one)
    assert error.value.rank == 1
    left = [(pid, cmd) for pid, cmd in _descendants(os.getpid())
            if pid not in before and "multiprocessing.resource_tracker" not in cmd]
    assert not left, f"processes left behind: {left}"
