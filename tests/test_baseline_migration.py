"""Baseline files of older schemas (1: before repeats and step costs; 2: before T(1) as a metric) are read as the
current schema and rewritten by a command."""

from __future__ import annotations

import json

import pytest

from specbench.cli import main
from specbench.gating.baselines import BaselineFileError, BaselineStore, compare
from specbench.gating.migrate import ADDED_SPEED_METRICS, SCHEMA_VERSION
from specbench.gating.regenerate import update_baseline
from _synthetic_results import make_result

OLD_SPEED_METRICS = ("tokens_per_s", "speedup", "time_to_first_token_s", "per_token_latency_s")


def as_schema_2(data: dict) -> dict:
    """What the same file looked like before schema 3: no step_latency_s metric (its repeats held T(1))."""
    data = json.loads(json.dumps(data))
    data["schema"] = 2
    for entry in data["cases"].values():
        for speed in entry["speed"].values():
            speed["metrics"].pop("step_latency_s")
    return data


def as_schema_1(data: dict) -> dict:
    """What the same file looked like before schema 2: no repeats, step costs or decode speedup."""
    data = as_schema_2(data)
    data["schema"] = 1
    for entry in data["cases"].values():
        for speed in entry["speed"].values():
            speed.pop("repeats")
            for name in ADDED_SPEED_METRICS[2]:
                speed["metrics"].pop(name)
            for request in speed["requests"]:
                request.pop("repeat")
                request.pop("plain_per_token_latency_s")
    return data


@pytest.fixture()
def old_store(tmp_path):
    new_dir, old_dir = tmp_path / "new", tmp_path / "old"
    update_baseline(make_result(seed=0, hardware_class="NVIDIA H200"), new_dir, command="pytest", reason="test")
    old_dir.mkdir()
    data = json.loads((new_dir / "medusa.json").read_text())
    (old_dir / "medusa.json").write_text(json.dumps(as_schema_1(data)))
    return new_dir, old_dir


def test_a_schema_1_file_is_read_as_schema_2_with_the_same_verdicts(old_store):
    new_dir, old_dir = old_store
    assert BaselineStore(old_dir).load("medusa")["schema"] == SCHEMA_VERSION
    for run in (make_result(seed=1, hardware_class="NVIDIA H200"),
                make_result(seed=1, hardware_class="NVIDIA H200", speed_scale=0.7, accept_scale=0.8)):
        old, new = compare(run, old_dir), compare(run, new_dir)
        for name in (*OLD_SPEED_METRICS, "acceptance_rate", "mean_acceptance_length", "exact_match"):
            assert (old.check(name).status, old.check(name).ci) == (new.check(name).status, new.check(name).ci), name
        for name in (*ADDED_SPEED_METRICS[2], "step_latency_s"):  # never recorded: skipped, saying why
            check = old.check(name)
            assert check.status == "skipped" and check.reason.startswith("the baseline holds no value")


def test_migrate_rewrites_old_files_once(old_store, capsys):
    _, old_dir = old_store
    path = old_dir / "medusa.json"
    assert main(["baselines", "migrate", "--baselines", str(old_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: schema 1 -> 2 -> 3 -> 4 (1 cases)"
    rewritten = json.loads(path.read_text())
    assert rewritten["schema"] == SCHEMA_VERSION
    speed = rewritten["cases"]["medusa-chain-k3"]["speed"]["NVIDIA H200"]
    assert speed["repeats"] == [] and all(r["repeat"] == 0 for r in speed["requests"])
    assert speed["metrics"]["step_latency_s"] is None  # no repeat records: no T(1) to compute it from
    assert main(["baselines", "migrate", "--baselines", str(old_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: schema {SCHEMA_VERSION}, current"


def test_a_schema_2_file_gets_t1_from_its_repeats_and_the_same_verdicts(tmp_path):
    new_dir, old_dir = tmp_path / "new", tmp_path / "old"
    update_baseline(make_result(seed=0, hardware_class="NVIDIA H200", num_repeats=3), new_dir, command="pytest",
                    reason="test")
    old_dir.mkdir()
    data = json.loads((new_dir / "medusa.json").read_text())
    (old_dir / "medusa.json").write_text(json.dumps(as_schema_2(data)))
    migrated = BaselineStore(old_dir).load("medusa")["cases"]["medusa-chain-k3"]["speed"]["NVIDIA H200"]
    stored = data["cases"]["medusa-chain-k3"]["speed"]["NVIDIA H200"]
    assert migrated["metrics"]["step_latency_s"] == stored["metrics"]["step_latency_s"]  # median of the repeats' t1_s
    run = make_result(seed=1, hardware_class="NVIDIA H200", num_repeats=3, speed_scale=0.8)
    old, new = compare(run, old_dir), compare(run, new_dir)
    assert (old.check("step_latency_s").status, old.check("step_latency_s").ci) == (
        new.check("step_latency_s").status, new.check("step_latency_s").ci)
    assert new.check("step_latency_s").status == "regression"  # 25% longer steps, beyond the 10% default


def test_the_stored_baselines_are_current():
    store = BaselineStore()
    for suite in ("medusa", "ngram", "speed", "draft"):
        assert json.loads(store.path(suite).read_text())["schema"] == SCHEMA_VERSION


def test_an_unknown_schema_is_refused_naming_it(tmp_path):
    (tmp_path / "medusa.json").write_text(json.dumps({"schema": 99, "suite": "medusa", "cases": {}}))
    with pytest.raises(BaselineFileError, match=r"medusa.json: key 'schema' is 99, expected 4"):
        BaselineStore(tmp_path).load("medusa")
