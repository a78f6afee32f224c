"""Where prompt records come from: the Hugging Face hub (probed first, so an absent network fails
in seconds), a local data directory through datasets' json builder, and JSON/JSONL parsing that
names the file and line of a bad record."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

try:
    import datasets
except ImportError:  # a GPU box may lack it (the lent H200 does): local files are still read, as plain JSON
    datasets = None

DATA_DIR_ENV = "SPECBENCH_DATA_DIR"


def iter_json_records(path: Path, label: str) -> Iterator[tuple[str, dict]]:
    """(location, record) pairs: a file starting with ``[`` is one JSON array, else JSON Lines."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"{label}: not UTF-8 text ({err}); prompt files must be UTF-8 JSON") from None
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{label}, line {err.lineno}: invalid JSON ({err.msg})") from None
        located = ((f"{label}, record {i}", r) for i, r in enumerate(records))
    else:
        located = _parse_json_lines(text.splitlines(), label)
    for where, record in located:
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, found {type(record).__name__}")
        yield where, record


def _parse_json_lines(lines: list[str], label: str) -> Iterator[tuple[str, object]]:
    for line_no, line in enumerate(lines, start=1):
        if line.strip():
            try:
                yield f"{label}, line {line_no}", json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{label}, line {line_no}: invalid JSON ({err.msg}, column {err.colno})") from None


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


def local_file(data_dir: str | None, relative: str) -> tuple[Path | None, str]:
    """The data file at a fixed relative path, or (None, what was checked)."""
    root = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    if not root:
        return None, f"local copy: {DATA_DIR_ENV} is not set"
    path = Path(root).expanduser() / relative
    if not path.is_file():
        return None, f"local copy: {path} not found"
    return path, ""


def unavailable_message(name: str, tried: list[str], relative: str) -> str:
    return (
        f"prompt set {name!r} is unavailable; tried: {'; '.join(tried)}. "
        f"Set {DATA_DIR_ENV}=/path/to/data (a directory holding {relative}) or pass data_dir=, "
        "or allow hub access (unset HF_HUB_OFFLINE)."
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


def non_blank_line_numbers(path: Path) -> list[int]:
    # the json builder skips blank lines, so record i sits on the i-th non-blank line
    with open(path, encoding="utf-8") as f:
        return [n for n, line in enumerate(f, start=1) if line.strip()]


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
