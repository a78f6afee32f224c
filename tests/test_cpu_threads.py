"""The CPU thread policy's decisions (from mocked affinity, quota and load readings), the environment record's
cpu_threads field, and `specbench run --threads`. Times are measured by bench/cpu_hog.py, not here."""

from __future__ import annotations

import pytest
import torch

from specbench import cpu_threads
from specbench.cli import build_parser
from specbench.cpu_threads import apply_policy, decide, other_load, usable_cores
from specbench.env import environment_fingerprint


@pytest.fixture
def restore_threads(monkeypatch):
    """apply_policy changes torch's thread count and the module's applied decision: put both back."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(cpu_threads, "_applied", None)
    yield
    torch.set_num_threads(threads)


def test_an_idle_machine_gets_a_thread_per_usable_core():
    policy = decide(cores=2, others=0.0, load=0.3)
    assert (policy.threads, policy.source, policy.oversubscribed) == (2, "load", False)
    assert policy.note() is None  # nothing to say on a quiet machine


def test_one_busy_neighbour_takes_its_core_away():
    # the reproduced case: one ~100% process on 2 cores; 2 threads took 428 s, 1 thread 26 s
    policy = decide(cores=2, others=1.0, load=1.2)
    assert policy.threads == 1
    assert not policy.oversubscribed  # 1.2 <= 2 cores
    assert "other processes keep 1.0 cores busy" in policy.note()


def test_a_crowded_machine_still_gets_one_thread_and_is_called_oversubscribed():
    policy = decide(cores=2, others=6.0, load=5.5)
    assert policy.threads == 1
    assert policy.oversubscribed
    assert "oversubscribed" in policy.note() and "5.5" in policy.note()


def test_half_a_busy_core_counts_as_busy():
    assert decide(cores=4, others=0.5, load=None).threads == 3
    assert decide(cores=4, others=0.4, load=None).threads == 4


def test_threads_flag_wins_over_the_environment_and_the_load():
    policy = decide(3, cores=2, others=1.0, load=4.0, env_threads="1")
    assert (policy.threads, policy.source) == (3, "--threads")
    assert policy.oversubscribed  # said even when the user chose the threads
    assert "--threads" in policy.note()


@pytest.mark.parametrize(("value", "expected"), [("1", (1, "OMP_NUM_THREADS")), ("0", (1, "load")),
                                                 ("many", (1, "load")), ("", (1, "load"))])
def test_omp_num_threads_is_honoured_only_when_valid(value, expected):
    policy = decide(cores=2, others=1.0, load=0.0, env_threads=value)
    assert (policy.threads, policy.source) == expected


def test_usable_cores_follow_affinity_and_cgroup_quota(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(cpu_threads, "_cgroup_quota", lambda: None)
    assert usable_cores() == 6
    monkeypatch.setattr(cpu_threads, "_cgroup_quota", lambda: 2.5)  # 250000/100000: a quota of 2.5 cores
    assert usable_cores() == 3
    monkeypatch.undo()
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")
    assert cpu_threads._cgroup_quota(quota) == 1.5
    quota.write_text("max 100000\n")
    assert cpu_threads._cgroup_quota(quota) is None


def test_other_load_is_the_running_count_less_the_reader(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_threads, "_SAMPLE_GAP_S", 0.0)
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("2.40 1.41 0.97 3/119 18844\n")  # 3 running: this reader and two others
    assert other_load(loadavg) == 2.0
    loadavg.write_text("0.00 0.00 0.00 1/119 18844\n")
    assert other_load(loadavg) == 0.0
    assert other_load(tmp_path / "absent") == 0.0  # no /proc (macOS): no load seen


def test_apply_sets_torch_threads_and_the_environment_record_carries_it(restore_threads):
    policy = apply_policy(1)
    assert torch.get_num_threads() == 1
    record = environment_fingerprint(device="cpu")["cpu_threads"]
    assert record == policy.record()
    assert record["threads"] == 1 and record["source"] == "--threads"
    assert set(record) == {"threads", "source", "usable_cores", "other_load", "load_1min", "oversubscribed"}


def test_without_a_decision_the_record_is_torchs_own_count(restore_threads):
    record = environment_fingerprint(device="cpu")["cpu_threads"]
    assert record["source"] == "torch default"
    assert record["threads"] == torch.get_num_threads()


def test_run_takes_threads_and_refuses_zero():
    assert build_parser().parse_args(["run", "--threads", "3"]).threads == 3
    assert build_parser().parse_args(["run"]).threads is None
    with pytest.raises(Exception, match="--threads"):
        build_parser().parse_args(["run", "--threads", "0"])


def test_ab_sides_get_one_thread_count_decided_once(monkeypatch):
    """compare/bisect run both commits' processes with the same torch threads (a base commit from before the
    policy obeys OMP_NUM_THREADS too), decided once rather than by each process from the load it sees."""
    from specbench.gating import ab_runs

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    ab_runs._ab_threads.cache_clear()
    loads = iter([1.0, 0.0, 0.0])  # a neighbour at the first reading only: later readings must not matter
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads, "other_load", lambda: next(loads))
    try:
        sides = [ab_runs.child_environment(), ab_runs.child_environment({"PYTHONPATH": "x"})]
        assert [env["OMP_NUM_THREADS"] for env in sides] == ["1", "1"]
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert ab_runs.child_environment()["OMP_NUM_THREADS"] == "2"  # the user's setting stands
        assert ab_runs.child_environment({"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"  # a --base-env one too
    finally:
        ab_runs._ab_threads.cache_clear()
