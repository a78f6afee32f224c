"""argparse ``type=`` functions that hold command-line values to the case rules (specbench.cases.VALUE_RULES)."""

from __future__ import annotations

import argparse

from specbench.cases import VALUE_RULES


def argument_type(key: str, convert=int):
    """An argparse ``type=`` for the case field ``key``: ``convert`` the text, then hold it to VALUE_RULES, so
    that a bad value is refused with the flag, the value and what is expected (exit status 2)."""
    test, expected = VALUE_RULES[key]

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not test(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.__name__ = key
    return parse


def list_argument_type(key: str):
    """An argparse ``type=`` for a comma-separated list of the case field ``key`` (``1,2,4``): every item held to
    VALUE_RULES, no item twice, so a bad list is refused naming the item and what is expected."""
    test, expected = VALUE_RULES[key]

    def parse(text: str) -> list[int]:
        items = [item.strip() for item in text.split(",")]
        values = []
        for item in items:
            value = int(item) if item.lstrip("-").isdigit() else None
            if value is None or not test(value):
                raise argparse.ArgumentTypeError(f"expected a comma-separated list of {key} values, each {expected}; "
                                                 f"got {item!r} in {text!r}")
            values.append(value)
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise argparse.ArgumentTypeError(f"expected distinct {key} values, got {repeated} more than once in {text!r}")
        return values

    parse.__name__ = f"{key} list"
    return parse


def parse_device(text: str) -> str:
    """argparse ``type=`` for a torch device this machine has: cpu, cuda, cuda:N (N below the device count), mps."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or mps, got {text!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r} needs a CUDA device and this machine has none "
                                             "(torch.cuda.is_available() is False); use --device cpu")
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s), cuda:0 to "
                                             f"cuda:{count - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available on this machine; use --device cpu")
    return text
