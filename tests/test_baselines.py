"""Baseline files: canonical format, load errors, regeneration rules, refusal, and crash-safe writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _synthetic_results import make_result, with_divergence

from specbench.io.file_lock import LockTimeout, locked
from specbench.gating.regenerate import update_baseline
from specbench.gating.baselines import (
    BASELINES_DIR_ENV, BaselineError, BaselineFileError, BaselineRefused, BaselineStore, CaseDefinitionChanged,
    compare, default_baselines_dir, format_baseline_file,
)

KILL_WRITER = Path(__file__).with_name("_kill_writer.py")
CASE = "medusa-chain-k3"


def _stored(store_dir: Path) -> dict:
    return json.loads((store_dir / "medusa.json").read_text())


def test_file_is_pretty_sorted_rounded_and_byte_stable(tmp_path):
    result = make_result(seed=0)
    result["metrics"]["time_to_first_token_s"] = float("nan")
    update_baseline(result, tmp_path, command="specbench run medusa", reason="test")
    text = (tmp_path / "medusa.json").read_text()
    assert text == format_baseline_file(json.loads(text))  # indent 2, sorted keys: the canonical form
    assert text.startswith('{\n  "cases": {')
    entry = json.loads(text)["cases"][CASE]
    request_tps = result["requests"][0]["tokens_per_s"]
    assert entry["speed"]["cpu"]["requests"][0]["tokens_per_s"] == float(f"{request_tps:.6g}")
    assert entry["speed"]["cpu"]["metrics"]["time_to_first_token_s"] is None  # NaN is not JSON
    assert entry["case"] == result["case"]
    provenance = entry["quality"]["provenance"]
    assert provenance["git_commit"] == "0123abc" and provenance["command"] == "specbench run medusa"
    assert provenance["date"] == result["created_at"] and provenance["env"]["hardware_class"] == "cpu"
    update_baseline(result, tmp_path, command="specbench run medusa", reason="test")
    assert (tmp_path / "medusa.json").read_text() == text  # same run, same bytes: no diff noise in review


def test_other_hardware_classes_and_unchanged_quality_are_kept(tmp_path):
    update_baseline(make_result(seed=0), tmp_path, command="first", reason="test")
    cpu_speed = _stored(tmp_path)["cases"][CASE]["speed"]["cpu"]
    gpu = make_result(seed=0, hardware_class="NVIDIA H200", speed_scale=5.0)  # same quality draws, faster
    diff = update_baseline(gpu, tmp_path, command="second", reason="test")
    entry = _stored(tmp_path)["cases"][CASE]
    assert entry["speed"]["cpu"] == cpu_speed
    assert entry["speed"]["NVIDIA H200"]["provenance"]["command"] == "second"
    assert entry["quality"]["provenance"]["command"] == "first"  # unchanged quality keeps its provenance
    assert "kept speed figures for: cpu" in diff.notes
    assert not [line for line in diff.changed if line.section == "quality"]

    changed = make_result(seed=1)
    diff = update_baseline(changed, tmp_path, command="third", reason="test")
    entry = _stored(tmp_path)["cases"][CASE]
    assert entry["quality"]["provenance"]["command"] == "third"
    assert set(entry["speed"]) == {"cpu", "NVIDIA H200"}
    assert entry["speed"]["NVIDIA H200"]["provenance"]["command"] == "second"
    old = make_result(seed=0)["metrics"]["acceptance_rate"]
    new = changed["metrics"]["acceptance_rate"]
    relative = (float(f"{new:.6g}") - float(f"{old:.6g}")) / float(f"{old:.6g}") * 100
    assert f"quality acceptance_rate: {old:.6g} -> {new:.6g} ({relative:+.1f}%)" in diff.format()


def test_refuses_to_store_an_fp32_run_that_diverged(tmp_path):
    update_baseline(make_result(seed=0), tmp_path, command="good", reason="test")
    before = (tmp_path / "medusa.json").read_bytes()
    diverged = with_divergence(make_result(seed=1), request_index=2, position=9, match_fraction=0.97)
    with pytest.raises(BaselineRefused, match=r"refusing .* request 'gsm8k-2' \(#2\) first diverges at output position 9"):
        update_baseline(diverged, tmp_path, command="bad", reason="test")
    assert (tmp_path / "medusa.json").read_bytes() == before


def test_refuses_bf16_under_the_stored_minimum_and_keeps_tolerances(tmp_path):
    bf16 = with_divergence(make_result(seed=0, dtype="bfloat16"), request_index=0, position=30, match_fraction=0.9)
    update_baseline(bf16, tmp_path, command="bf16", reason="test")  # 0.9 clears the default minimum 0.5
    data = _stored(tmp_path)
    data["cases"][CASE]["tolerances"] = {"min_match_fraction": 0.95, "acceptance_rate": 0.1}  # a reviewer's edit
    (tmp_path / "medusa.json").write_text(format_baseline_file(data))
    with pytest.raises(BaselineRefused, match="match fraction 0.900 is under the minimum 0.950"):
        update_baseline(bf16, tmp_path, command="bf16 again", reason="test")
    exact = make_result(seed=0, dtype="bfloat16")
    update_baseline(exact, tmp_path, command="exact", reason="test")
    assert _stored(tmp_path)["cases"][CASE]["tolerances"] == {"min_match_fraction": 0.95, "acceptance_rate": 0.1}
    assert compare(exact, tmp_path).check("acceptance_rate").tolerance == 0.1


def test_invalid_json_names_the_file_and_how_to_regenerate(tmp_path):
    (tmp_path / "medusa.json").write_text('{"schema": 1, "cases": {')
    with pytest.raises(BaselineFileError) as err:
        compare(make_result(seed=0), tmp_path)
    message = str(err.value)
    assert str(tmp_path / "medusa.json") in message and "not valid JSON" in message and "line 1" in message
    assert "regenerate" in message


@pytest.mark.parametrize("key_path", [("cases", CASE, "quality", "metrics", "acceptance_rate"),
                                      ("cases", CASE, "speed", "cpu", "requests"),
                                      ("schema",)])
def test_missing_key_names_the_file_and_the_key(tmp_path, key_path):
    update_baseline(make_result(seed=0), tmp_path, command="x", reason="test")
    data = _stored(tmp_path)
    parent = data
    for key in key_path[:-1]:
        parent = parent[key]
    del parent[key_path[-1]]
    (tmp_path / "medusa.json").write_text(json.dumps(data))
    with pytest.raises(BaselineFileError, match=rf"medusa\.json: missing key '{'.'.join(key_path)}'.*regenerate"):
        BaselineStore(tmp_path).entry(f"medusa/{CASE}")


def test_non_numeric_metric_in_the_file_is_an_error(tmp_path):
    update_baseline(make_result(seed=0), tmp_path, command="x", reason="test")
    data = _stored(tmp_path)
    data["cases"][CASE]["quality"]["metrics"]["per_position_acceptance_rate"][1] = "0.5"
    (tmp_path / "medusa.json").write_text(format_baseline_file(data))
    with pytest.raises(BaselineFileError, match=rf"key 'cases.{CASE}.quality.metrics.per_position_acceptance_rate' "
                                                r"must be a number, null or a list of numbers"):
        compare(make_result(seed=0), tmp_path)


def test_misspelt_tolerance_in_the_file_is_an_error(tmp_path):
    update_baseline(make_result(seed=0), tmp_path, command="x", reason="test")
    data = _stored(tmp_path)
    data["cases"][CASE]["tolerances"] = {"acceptence_rate": 0.1}
    (tmp_path / "medusa.json").write_text(format_baseline_file(data))
    with pytest.raises(BaselineFileError, match=rf"key 'cases.{CASE}.tolerances': unknown tolerance 'acceptence_rate'"):
        compare(make_result(seed=0), tmp_path)


def test_changed_case_definition_is_detected(tmp_path):
    update_baseline(make_result(seed=0), tmp_path, command="cpu", reason="test")
    update_baseline(make_result(seed=0, hardware_class="NVIDIA H200"), tmp_path, command="gpu", reason="test")
    edited = make_result(seed=0, max_new_tokens=128)
    with pytest.raises(CaseDefinitionChanged, match=r"max_new_tokens: baseline 64, now 128.*regenerate"):
        compare(edited, tmp_path)
    judged_differently = make_result(seed=0)
    judged_differently["case"].update(description="a comment", tolerances={"speedup": 0.2}, gate_quality=False,
                                      min_gpu_gib=24)  # how a run is judged or scheduled, not what it measures
    assert compare(judged_differently, tmp_path).passed

    diff = update_baseline(edited, tmp_path, command="regenerated", reason="test")
    entry = _stored(tmp_path)["cases"][CASE]
    assert entry["case"]["max_new_tokens"] == 128 and set(entry["speed"]) == {"cpu"}
    assert any("case definition changed (max_new_tokens" in n for n in diff.notes)
    assert "dropped speed figures recorded for the old definition on: NVIDIA H200" in diff.notes
    assert compare(edited, tmp_path).passed


def test_default_directory_and_suite_names(tmp_path, monkeypatch):
    monkeypatch.delenv(BASELINES_DIR_ENV, raising=False)
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert default_baselines_dir() == tmp_path.resolve() / "baselines"
    monkeypatch.setenv(BASELINES_DIR_ENV, str(tmp_path / "elsewhere"))
    assert BaselineStore().directory == tmp_path / "elsewhere"
    with pytest.raises(BaselineError, match="file-name-safe suite"):
        update_baseline(make_result(seed=0, suite="../escape"), tmp_path, command="x", reason="test")


def _start_writer(store_dir: Path, job_path: Path, *mode: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(KILL_WRITER), str(store_dir), str(job_path), *mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _wait_for(condition, what: str, timeout_s: float = 60.0):
    """Poll ``condition`` until it returns something truthy (returned): the test waits on a state the other
    process's progress must produce, never for a guessed duration; ``timeout_s`` only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        os.sched_yield()
    return value


def _new_partial_temp_file(store: Path, before: set[str]) -> bool:
    """A temp file this trial's writer created and has begun filling, i.e. the writer is inside a write."""
    for path in store.glob(".medusa.json.*.tmp"):
        try:
            if path.name not in before and path.stat().st_size > 0:
                return True
        except FileNotFoundError:  # renamed into place between the listing and the stat
            pass
    return False


def test_sigkill_during_regeneration_leaves_the_old_or_the_new_file(tmp_path):
    """Writers SIGKILLed at chosen moments: the file always parses and is exactly one complete version.

    12 trials kill a bare atomic rewrite loop (nearly all its time is spent writing), 6 more kill full
    update_baseline loops (lock, load, merge, format, write). Each kill point is a state observed in the store,
    not a delay: right after the fork ("start"), while a temp file of the trial's writer is partly written
    ("mid-write"), and just after the writer replaced the file with the other version ("replaced"; the next
    write is then under way). The replaced trials start alternately from the old and the new file, so both
    directions of replacement are seen whatever the scheduling.
    """
    old, new = make_result(seed=0, num_requests=150), make_result(seed=1, num_requests=150)
    fillers = [make_result(seed=s, num_requests=150, name=f"filler-{s}") for s in range(4)]  # a large-ish file

    def file_after(*results) -> str:
        directory = tmp_path / f"reference-{len(results)}"
        for result in results:
            update_baseline(result, directory, command="tests/_kill_writer.py", reason="test")
        return (directory / "medusa.json").read_text()

    old_text, new_text = file_after(*fillers, old), file_after(*fillers, old, new)
    assert old_text != new_text and len(old_text) > 300_000  # big enough that a write spans many syscalls
    store = tmp_path / "store"
    store.mkdir()
    baseline_file = store / "medusa.json"
    baseline_file.write_text(old_text)
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps({"results": [new, old], "texts": [new_text, old_text]}))  # alternate new, old
    server = _start_writer(store, job_path, "--serve", stdin=subprocess.PIPE)
    schedule = [(mode, point) for mode, trials in (("write", 4), ("update", 2))
                for _ in range(trials) for point in ("start", "mid-write", "replaced")]
    replaced_seen = []
    try:
        for trial, (mode, point) in enumerate(schedule):
            if point == "replaced":  # start from old and new in turn (no writer runs between trials)
                start_text = (old_text, new_text)[len(replaced_seen) % 2]
                baseline_file.write_text(start_text)
            before = {p.name for p in store.iterdir()}
            server.stdin.write(f"fork {mode}\n")
            server.stdin.flush()
            reply = server.stdout.readline()
            assert reply.startswith("child "), f"writer server failed: {reply!r} {server.stderr.read() if not reply else ''}"
            if point == "mid-write":
                _wait_for(lambda: _new_partial_temp_file(store, before), f"trial {trial}: a write in progress")
            elif point == "replaced":
                other = new_text if start_text == old_text else old_text
                _wait_for(lambda: baseline_file.read_text() == other, f"trial {trial}: the file replaced")
                replaced_seen.append(other == new_text)
            os.kill(int(reply.split()[1]), signal.SIGKILL)
            status = int(server.stdout.readline().split()[1])
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"trial {trial}: writer crashed"
            text = baseline_file.read_text()
            assert text in (old_text, new_text), \
                f"trial {trial} ({mode}, {point}): partial or foreign content ({len(text)} chars)"
            json.loads(text)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        server.stdout.close()
        server.stderr.close()
    assert set(replaced_seen) == {True, False}  # writers did replace the file during the trials, both ways
    # the next writer clears killed writers' temp files
    update_baseline(old, store, command="tests/_kill_writer.py", reason="test")
    assert [p.name for p in store.iterdir()] == ["medusa.json"]


# holds the lock update_baseline takes on DIR until a line arrives on stdin (or it is killed), saying so on stdout
LOCK_HOLDER = """
import sys
from specbench.io.file_lock import locked
with locked(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _hold_lock(directory: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(directory)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    assert holder.stdout.readline() == "held\n", "the lock holder did not start"
    return holder


def test_an_updater_waits_for_the_directory_lock_and_proceeds_after_release(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    holder = _hold_lock(store)
    try:
        with pytest.raises(LockTimeout):  # held by the other process: one attempt fails at once
            with locked(store, timeout=0):
                pass
        updater = threading.Thread(target=update_baseline, args=(make_result(seed=0), store),
                                   kwargs={"command": "t", "reason": "test"})
        updater.start()
        updater.join(timeout=0.5)  # a lock that did not exclude it would let it finish in well under 0.5 s
        assert updater.is_alive() and not (store / "medusa.json").exists(), "update_baseline ignored the lock"
    finally:
        holder.communicate("release\n", timeout=30)  # the holder exits: the lock is free
    updater.join(timeout=60)
    assert not updater.is_alive() and CASE in _stored(store)["cases"]
    with locked(store, timeout=0):  # and nobody holds it afterwards
        pass


def test_a_killed_holder_releases_the_directory_lock(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    holder = _hold_lock(store)
    holder.kill()  # SIGKILL: no cleanup code runs; the OS drops the lock with the process
    holder.communicate(timeout=30)
    with locked(store, timeout=0):
        pass
    update_baseline(make_result(seed=0), store, command="after the kill", reason="test")
    assert [p.name for p in store.iterdir()] == ["medusa.json"]  # the lock file lives beside the directory


def test_concurrent_updaters_lose_no_case(tmp_path):
    writers = []
    for k in range(4):
        job_path = tmp_path / f"job-{k}.json"
        job_path.write_text(json.dumps({"results": [make_result(seed=k, num_requests=100, name=f"case-{k}")]}))
        writers.append(_start_writer(tmp_path / "store", job_path, "--rounds", "2"))
    for writer in writers:
        _, stderr = writer.communicate(timeout=60)
        assert writer.returncode == 0, stderr
    assert sorted(_stored(tmp_path / "store")["cases"]) == [f"case-{k}" for k in range(4)]


def test_a_baseline_stored_before_a_case_key_existed_still_matches_its_case():
    """baselines/*.json predating the ``engine`` key ran on the eager engine: they match an eager case,
    and a static case of the same name is a different definition (its own baseline is needed)."""
    from specbench.gating.baselines import case_changes

    stored = {"name": "chain-k3", "suite": "medusa", "dtype": "float32"}  # written before `engine` existed
    assert case_changes(stored, {**stored, "engine": "eager"}) == []
    assert case_changes(stored, {**stored, "engine": "static"}) == ["engine: baseline 'eager', now 'static'"]
