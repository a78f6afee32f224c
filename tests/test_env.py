"""The environment fingerprint: every documented key, the CPU hardware class, the git commit."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import torch

from specbench import env
from specbench.env import FINGERPRINT_KEYS, environment_fingerprint, gpu_memory_gib, hardware_class

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    # GIT_OPTIONAL_LOCKS=0: reading the status must not rewrite the checkout's index
    git_env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, env=git_env)
    return done.stdout.strip() if done.returncode == 0 else None


def test_keys_values_and_json_round_trip():
    fingerprint = environment_fingerprint(dtype=torch.bfloat16)
    assert tuple(fingerprint) == FINGERPRINT_KEYS
    assert fingerprint["dtype"] == "bfloat16"  # a torch.dtype and its name record the same
    assert environment_fingerprint(device="cpu", dtype="float32")["dtype"] == "float32"
    assert fingerprint["torch"] == torch.__version__
    assert fingerprint["cpu_count"] >= 1
    # stored with every run as JSON, so it must survive a round trip unchanged
    assert json.loads(json.dumps(fingerprint)) == fingerprint


def test_no_hostname_or_personal_fields():
    fingerprint = environment_fingerprint()
    assert not [k for k in fingerprint if any(word in k for word in ("host", "node", "user", "path"))]
    hostname = socket.gethostname()
    if len(hostname) >= 4:  # a very short name like "vm" occurs inside ordinary words
        assert hostname not in json.dumps(fingerprint)


@pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without CUDA; this one has a GPU")
def test_cpu_machine_has_cpu_hardware_class_and_no_gpu_facts():
    fingerprint = environment_fingerprint()
    assert fingerprint["hardware_class"] == "cpu" and fingerprint["device"] == "cpu"
    assert fingerprint["cuda_available"] is False and fingerprint["gpu_count"] == 0
    for key in ("gpu_name", "gpu_memory_bytes", "gpu_memory_gib", "driver_version"):
        assert fingerprint[key] is None, key
    assert gpu_memory_gib() is None and gpu_memory_gib(3) is None


def test_cpu_device_is_cpu_class_even_with_a_gpu():
    fingerprint = environment_fingerprint(device="cpu")
    assert (fingerprint["device"], fingerprint["hardware_class"], fingerprint["gpu_name"]) == ("cpu", "cpu", None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_memory_is_binary_gib_of_total_memory():
    total = torch.cuda.get_device_properties(0).total_memory
    assert gpu_memory_gib(0) == total / 2**30
    fingerprint = environment_fingerprint(device="cuda:0")
    assert fingerprint["gpu_memory_bytes"] == total and fingerprint["device"] == "cuda:0"
    assert fingerprint["hardware_class"] == hardware_class(torch.cuda.get_device_name(0)) != "cpu"


def test_hardware_class_normalises_whitespace_and_keeps_variants():
    assert hardware_class(None) == "cpu" and hardware_class("  ") == "cpu"
    assert hardware_class("  NVIDIA   H200 ") == "NVIDIA H200"
    # 40 GB and 80 GB A100s differ in bandwidth, so they stay separate classes
    assert hardware_class("NVIDIA A100-SXM4-40GB") != hardware_class("NVIDIA A100-SXM4-80GB")


def test_git_commit_and_dirty_flag_match_git():
    head = _git("rev-parse", "HEAD")
    if head is None or Path(_git("rev-parse", "--show-toplevel") or "/").resolve() != REPO_ROOT:
        pytest.skip("not run from a git checkout of specbench")
    fingerprint = environment_fingerprint()
    assert fingerprint["git_commit"] == head
    assert fingerprint["git_dirty"] == bool(_git("status", "--porcelain", "--untracked-files=no"))


def test_git_state_is_none_outside_the_checkout(monkeypatch, tmp_path):
    # specbench installed into site-packages must not report some enclosing repository's commit
    monkeypatch.setattr(env, "_PROJECT_ROOT", tmp_path)
    fingerprint = environment_fingerprint()
    assert (fingerprint["git_commit"], fingerprint["git_dirty"]) == (None, None)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_git_state_is_none_in_a_repository_without_commits(monkeypatch, tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.setattr(env, "_PROJECT_ROOT", tmp_path.resolve())
    assert env._git_state() == (None, None)


def test_missing_tools_give_none_not_errors(monkeypatch):
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    assert env._driver_version(0) is None
    monkeypatch.setattr(env, "_run", lambda command: None)  # git absent
    assert env._git_state() == (None, None)
