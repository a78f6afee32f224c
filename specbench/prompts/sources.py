"""Where prompt records come from: the Hugging Face hub (probed first, so an absent network fails
in seconds) and the local data directory (``$SPECBENCH_DATA_DIR``) through datasets' json builder,
or plain JSON where `datasets` is not installed."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

try:
    import datasets
except ImportError:  # a GPU box may lack it (the lent H200 does): local files are still read, as plain JSON
    datasets = None

from specbench.io.jsonl import iter_json_records
from specbench.references import DATA_DIR_ENV, data_dir



def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def load_hub_split(hub_id: str, config: str, split: str) -> tuple[list[dict] | None, str]:
    """(records, "") from the hub (or its local cache), or (None, why not) — quickly when offline."""
    if datasets is None:
        return None, "skipped, the `datasets` package is not installed (pip install datasets)"
    if _env_flag("HF_HUB_OFFLINE") or _env_flag("HF_DATASETS_OFFLINE"):
        if not datasets.config.HF_HUB_OFFLINE:
            # the variable was set after `datasets` was imported; it would still go online
            return None, "skipped, HF_HUB_OFFLINE is set"
    else:
        reason = hub_unreachable_reason(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        if reason:
            return None, reason
    try:
        with quiet_datasets():
            return datasets.load_dataset(hub_id, config, split=split).to_list(), ""
    except Exception as err:  # any hub failure means "try the local copy"; the reason is kept
        return None, f"{type(err).__name__}: {err}".splitlines()[0][:300]


@lru_cache(maxsize=None)
def hub_unreachable_reason(endpoint: str, timeout_s: float = 3.0) -> str:
    """Why the hub cannot be reached ("" when a TCP connection opens). Without this probe an
    absent network costs ~25 s of retries inside huggingface_hub before the local copy is tried."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return ""  # a direct connection says nothing about the proxy; let the hub client try
    url = urlparse(endpoint)
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    errors: list[OSError] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as err:
            errors.append(err)

    # a thread bounds the DNS lookup too, which socket timeouts do not cover
    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout_s)
    if probe.is_alive():
        return f"hub unreachable (no connection to {host}:{port} within {timeout_s:g} s)"
    return f"hub unreachable ({host}:{port}: {errors[0]})" if errors else ""


def local_file(override: str | None, relative: str) -> tuple[Path | None, str]:
    """The data file at a fixed relative path under ``override`` or ``$SPECBENCH_DATA_DIR``, or
    (None, what was checked)."""
    root = data_dir(override)
    if root is None:
        return None, f"local copy: {DATA_DIR_ENV} is not set"
    path = root / relative
    if not path.is_file():
        return None, f"local copy: {path} not found"
    return path, ""


def _hub_advice() -> str:
    """How to let the hub be reached: unset the offline variables that are set, else a network or proxy."""
    offline = [name for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if _env_flag(name)]
    if offline:
        return f"allow hub access (unset {' and '.join(offline)})"
    return "reach the hub (a network connection, HTTPS_PROXY, or HF_ENDPOINT for a mirror)"


def unavailable_message(name: str, tried: list[str], relative: str) -> str:
    return (
        f"prompt set {name!r} is unavailable; tried: {'; '.join(tried)}. "
        f"To fix: set {DATA_DIR_ENV}=/path/to/data, a directory holding {relative} "
        f"(from Python, load_prompts(..., data_dir=) does the same), or {_hub_advice()}."
    )


def read_local_jsonl(path: Path) -> list[dict]:
    """Records of a JSON Lines file through datasets' json builder, without touching the HF cache
    (plain JSON parsing when `datasets` is not installed)."""
    if datasets is None:
        return [record for _, record in iter_json_records(path, str(path))]
    try:
        with tempfile.TemporaryDirectory(prefix="specbench-datasets-") as cache_dir, quiet_datasets():
            return datasets.load_dataset(
                "json", data_files=str(path), split="train", cache_dir=cache_dir, keep_in_memory=True
            ).to_list()
    except Exception as err:
        list(iter_json_records(path, str(path)))  # raises with the offending line when it is bad JSON
        raise ValueError(f"{path}: datasets could not read it ({type(err).__name__}: {err})") from err


def require_keys(rows: list[dict], keys: tuple[str, ...], origin: str, line_numbers: list[int] | None = None) -> None:
    for i, row in enumerate(rows):
        for key in keys:
            if row.get(key) is None:
                where = f"line {line_numbers[i]}" if line_numbers else f"record {i}"
                raise ValueError(f"{origin}, {where}: key {key!r} is missing; expected keys {', '.join(keys)}")


@contextmanager
def quiet_datasets():
    """Silence datasets' progress bars and retry warnings for one call, then restore them."""
    verbosity, bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()
