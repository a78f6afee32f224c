"""Key names of the published Medusa checkpoint layouts (docs/checkpoints.md), how head and layer counts
are read off them, and their translation to MedusaHeads' own parameter names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.checkpoints.medusa_config import MedusaCheckpointError

# parts of a head: a residual block's Linear weight and bias, and the head's vocab projection
BLOCK_WEIGHT, BLOCK_BIAS, VOCAB = "block_weight", "block_bias", "vocab"


@dataclass(frozen=True)
class KeyScheme:
    """Key templates; {h} = head, {l} = residual block, {L} = number of blocks (the vocab projection
    sits after the blocks in FasterDecoding's nn.Sequential, so its index is L)."""

    block_weight: str
    block_bias: str
    vocab: str

    def key(self, part: str, head: int, layer: int = 0, num_layers: int = 0) -> str:
        return getattr(self, part).format(h=head, l=layer, L=num_layers)

    def parse(self, key: str) -> tuple[str, int, int | None] | None:
        """(part, head, layer index in the key or None) or None when the key is not of this scheme."""
        for part, pattern in _patterns(self).items():
            match = pattern.fullmatch(key)
            if match:
                groups = match.groupdict()
                return part, int(groups["h"]), int(groups["l"]) if groups.get("l") is not None else None
        return None


_PATTERN_CACHE: dict[KeyScheme, dict[str, re.Pattern]] = {}


def _patterns(scheme: KeyScheme) -> dict[str, re.Pattern]:
    if scheme not in _PATTERN_CACHE:
        # indices are written without leading zeros, so "01" is not head 1 (it would not round-trip)
        index = r"(?:0|[1-9][0-9]{0,5})"
        _PATTERN_CACHE[scheme] = {
            part: re.compile(
                re.escape(getattr(scheme, part))
                .replace(r"\{h\}", f"(?P<h>{index})")
                .replace(r"\{l\}", f"(?P<l>{index})")
                .replace(r"\{L\}", f"(?P<l>{index})")
            )
            for part in (BLOCK_WEIGHT, BLOCK_BIAS, VOCAB)
        }
    return _PATTERN_CACHE[scheme]


KEY_SCHEMES = {
    "fasterdecoding": KeyScheme("{h}.{l}.linear.weight", "{h}.{l}.linear.bias", "{h}.{L}.weight"),
    "vllm": KeyScheme("blocks.{h}.layers.{l}.weight", "blocks.{h}.layers.{l}.bias", "lm_heads.{h}.weight"),
    "medusa2": KeyScheme("medusa_head.{h}.{l}.linear.weight", "medusa_head.{h}.{l}.linear.bias", "medusa_head.{h}.{L}.weight"),
}
# specbench.medusa.heads.MedusaHeads' state_dict names
MODULE_SCHEME = KeyScheme("blocks.{h}.{l}.linear.weight", "blocks.{h}.{l}.linear.bias", "lm_heads.{h}.weight")


@dataclass(frozen=True)
class HeadStructure:
    num_heads: int
    num_layers: int
    has_vocab_projection: bool
    has_bias: bool


def infer_structure(scheme: KeyScheme, keys: list[str], weights_file: Path) -> HeadStructure:
    """Head and block counts as the keys show them (configs are known to be wrong about them)."""
    parsed = [p for p in map(scheme.parse, keys) if p is not None]
    if not parsed:
        raise MedusaCheckpointError(
            f"{weights_file}: no Medusa head keys of the form {scheme.block_weight!r} / {scheme.vocab!r}; "
            f"found {sorted(keys)[:8]}{' ...' if len(keys) > 8 else ''}"
        )
    num_heads = 1 + max(head for _, head, _ in parsed)
    num_layers = 0
    for part, _, layer in parsed:
        if part == VOCAB:
            num_layers = max(num_layers, layer or 0)
        else:
            num_layers = max(num_layers, layer + 1)
    # every head has at least one key, so a larger index means keys are missing wholesale; refuse
    # before building an expected-key set of that size
    if num_heads > len(keys) or num_layers > len(keys):
        raise MedusaCheckpointError(
            f"{weights_file}: the keys name head {num_heads - 1} / block {num_layers - 1}, but the file holds only "
            f"{len(keys)} head keys; the checkpoint is incomplete"
        )
    return HeadStructure(
        num_heads=num_heads,
        num_layers=num_layers,
        has_vocab_projection=any(part == VOCAB for part, _, _ in parsed),
        has_bias=any(part == BLOCK_BIAS for part, _, _ in parsed),
    )


def key_map(scheme: KeyScheme, structure: HeadStructure) -> dict[str, tuple[str, str]]:
    """Every key the structure needs in `scheme` -> (MedusaHeads name, part)."""
    L = structure.num_layers
    keys: dict[str, tuple[str, str]] = {}
    for h in range(structure.num_heads):
        parts = [(BLOCK_WEIGHT, l) for l in range(L)]
        if structure.has_bias:
            parts += [(BLOCK_BIAS, l) for l in range(L)]
        if structure.has_vocab_projection:
            parts.append((VOCAB, L))
        for part, l in parts:
            keys[scheme.key(part, h, l, L)] = (MODULE_SCHEME.key(part, h, l, L), part)
    return keys


def check_key_set(weights_file: Path, layout: str, structure: HeadStructure, present: list[str], expected: dict) -> None:
    missing = sorted(set(expected) - set(present))
    unexpected = sorted(set(present) - set(expected))
    if not missing and not unexpected:
        return
    lines = [
        f"{weights_file}: the {layout} keys do not form {structure.num_heads} heads x {structure.num_layers} blocks "
        f"({'with' if structure.has_vocab_projection else 'without'} vocab projections); nothing was loaded"
    ]
    if missing:
        lines.append(f"  missing keys ({len(missing)}): " + ", ".join(map(repr, missing)))
    if unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): " + ", ".join(map(repr, unexpected)))
    lines.append("  re-download the checkpoint, or re-export it with specbench.medusa.checkpoint.save_medusa_heads")
    raise MedusaCheckpointError("\n".join(lines))


def expected_shape(part: str, hidden_size: int, vocab_size: int) -> tuple[int, ...]:
    # nn.Linear stores (out_features, in_features)
    return {BLOCK_WEIGHT: (hidden_size, hidden_size), BLOCK_BIAS: (hidden_size,), VOCAB: (vocab_size, hidden_size)}[part]


def check_tensors(
    weights_file: Path, tensors: dict[str, object], expected: dict[str, tuple[str, str]], hidden_size: int, vocab_size: int, basis: str
) -> None:
    """Every tensor is a floating tensor of the shape its part needs; all problems are listed at once."""
    problems = []
    for key, (_, part) in sorted(expected.items()):
        tensor = tensors[key]
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"key {key!r} holds a {type(tensor).__name__}, expected a tensor")
            continue
        if not tensor.is_floating_point():
            problems.append(f"key {key!r} has dtype {tensor.dtype}, expected a floating dtype")
        want = expected_shape(part, hidden_size, vocab_size)
        found = tuple(tensor.shape)
        if found != want:
            hint = " (it looks transposed)" if found == want[::-1] else ""
            problems.append(f"key {key!r} has shape {found}, expected {want}{hint}")
    if problems:
        raise MedusaCheckpointError(
            f"{weights_file}: {len(problems)} tensor(s) do not fit heads with {basis}; nothing was loaded\n  "
            + "\n  ".join(problems)
            + "\n  check that the heads were trained for this target (base_model_name_or_path in config.json)"
        )
