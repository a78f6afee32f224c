"""The target a batched bench script runs: the synthetic 7B of `specbench zoo synth` (bf16), or a tiny random Llama."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specbench.checkpoints.tiny import tiny_llama
from specbench.engine.static_target import StaticTarget


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """``--synth-dir DIR`` or ``--tiny`` (one is required), and ``--device``."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--synth-dir", help="`specbench zoo synth DIR` output (its target/ is loaded, bf16)")
    source.add_argument("--tiny", action="store_true", help="a seeded tiny random Llama in fp32 instead (smoke test)")
    parser.add_argument("--device", default="cuda")


def load_target(args: argparse.Namespace) -> tuple[StaticTarget, str]:
    """(the static target, its dtype's name) the arguments name, on ``args.device``."""
    device = torch.device(args.device)
    if args.tiny:  # small enough for the CPU
        return StaticTarget.from_hf_model(tiny_llama(seed=0, max_context=512).to(device)), "float32"
    return StaticTarget.from_pretrained(str(Path(args.synth_dir) / "target"), dtype=torch.bfloat16, device=device), "bfloat16"
