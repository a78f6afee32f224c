"""Model-reference resolution: local directories, the HF cache, offline behaviour, malformed refs.

No test reaches the network: HF_HUB_OFFLINE=1 or allow_download=False, or snapshot_download is
replaced by a stub that refuses any non-cache call.
"""

from __future__ import annotations

import huggingface_hub
import pytest
import torch
from huggingface_hub.errors import LocalEntryNotFoundError

from specbench.checkpoints import resolve
from specbench.checkpoints.resolve import InvalidModelRef, ModelUnavailable, load_target_model, resolve_model_dir
from specbench.checkpoints.tiny import tiny_llama

_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def isolated_hub(monkeypatch, tmp_path):
    """An empty HF cache under tmp_path, offline, and a snapshot_download that only reads the cache."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    real_snapshot_download = huggingface_hub.snapshot_download

    def cache_only(repo_id, **kwargs):
        if not kwargs.get("local_files_only"):
            raise AssertionError(f"test tried to download {repo_id} from the hub")
        return real_snapshot_download(repo_id, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", cache_only)


def _saved_tiny(tmp_path, name="tiny"):
    model = tiny_llama(seed=3, vocab_size=64, hidden_size=32, num_layers=1)
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_local_directory_resolves_and_loads(tmp_path):
    model, model_dir = _saved_tiny(tmp_path)
    assert resolve_model_dir(str(model_dir)) == model_dir.resolve()
    assert resolve_model_dir(model_dir) == model_dir.resolve()  # os.PathLike too

    loaded = load_target_model(model_dir, dtype=torch.float32, device="cpu")
    assert not loaded.training
    _assert_same_weights(model, loaded)
    input_ids = torch.tensor([[1, 5, 9, 2]])
    assert torch.equal(model(input_ids).logits, loaded(input_ids).logits)


def test_load_target_model_honours_dtype(tmp_path):
    model, model_dir = _saved_tiny(tmp_path)
    loaded = load_target_model(str(model_dir), dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))


def test_hub_id_found_in_hf_home_cache_while_offline(tmp_path):
    model, _ = _saved_tiny(tmp_path)
    repo_dir = tmp_path / "hf_home" / "hub" / "models--some-org--tiny"
    snapshot = repo_dir / "snapshots" / _COMMIT
    model.save_pretrained(snapshot)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(_COMMIT)

    assert resolve_model_dir("some-org/tiny") == snapshot
    _assert_same_weights(model, load_target_model("some-org/tiny", dtype=torch.float32, device="cpu"))


def test_hub_id_missing_from_cache_offline_is_unavailable(tmp_path):
    with pytest.raises(ModelUnavailable) as info:
        resolve_model_dir("some-org/not-cached")
    message = str(info.value)
    assert info.value.ref == "some-org/not-cached"
    assert "'some-org/not-cached'" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert str(tmp_path / "hf_home" / "hub") in message  # the cache that was searched
    assert "hf download some-org/not-cached" in message and "HF_HOME" in message


def test_allow_download_false_is_unavailable_without_offline_flag(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ModelUnavailable, match=r"(?s)'some-org/x'.*allow_download=False"):
        resolve_model_dir("some-org/x", allow_download=False)


def test_unreachable_hub_is_unavailable(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def unreachable(repo_id, **kwargs):
        raise LocalEntryNotFoundError("Got: ConnectError: [Errno 111] Connection refused")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(ModelUnavailable, match=r"(?s)'some-org/x'.*hub unreachable.*Connection refused"):
        resolve_model_dir("some-org/x")


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "gpt2",  # bare names are not accepted as hub ids: say org/name
        "org/name/extra",
        "../outside/dir",
        "org/../name",
        "org/na--me",
        "a b/c",
        "-org/name",
        "org/name\x00",
        "/definitely/not/a/dir",
    ],
)
def test_malformed_ref_is_rejected(ref):
    with pytest.raises(InvalidModelRef, match="model reference"):
        resolve_model_dir(ref)


def test_file_instead_of_directory_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidModelRef, match="is a file"):
        resolve_model_dir(tmp_path / "config.json")


def test_hf_hub_cache_env_takes_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "explicit"))
    assert resolve.hf_hub_cache_dir() == tmp_path / "explicit"
