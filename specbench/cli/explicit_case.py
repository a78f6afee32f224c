"""The explicit form of ``specbench run`` (--target/--proposer/--prompts ...): the one new case its flags describe,
named after the settings the command line gave, as an overridden stored case is."""

from __future__ import annotations

import argparse
from pathlib import Path

from specbench.cases import OVERRIDABLE, Case, changed_name

REFERENCE_TARGET = "specbench-ref/gsm8k-tiny"
REFERENCE_MEDUSA = "specbench-ref/gsm8k-tiny-medusa"
REFERENCE_TREE = "gsm8k-tiny-63"
EXPLICIT_FLAGS = ("target", "proposer", "proposer_path", "tree", "num_speculative_tokens", "prompts")
_EXPLICIT_DEFAULTS = Case(name="cli")  # what the explicit form takes for a setting left out
# the explicit flags a name shows, in this order, then the OVERRIDABLE settings (the proposer is the name itself)
_NAMED_FLAGS = ("target", "proposer_path", "tree", "num_speculative_tokens", "prompts")


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _named_value(value) -> str | int | float | bool:
    """A model, tree or prompt reference as a case name can hold it (no '/'): a local file or directory by its
    own name, a hub id or a reference with ':' for '/' (specbench-ref:gsm8k-tiny, spec_bench:coding)."""
    if not isinstance(value, str) or "/" not in value:
        return value
    return Path(value).name if Path(value).exists() else value.strip("/").replace("/", ":")


def explicit_name(args: argparse.Namespace) -> str:
    """cli/NAME's NAME: --name if given, else the proposer named after the settings the command line gave,
    ``ngram[num_speculative_tokens=2,prompts=gsm8k,max_new_tokens=32]``, so two runs of different settings are
    two cases in the history (and never one case's baseline)."""
    if args.name:
        return args.name
    given = {key: _named_value(getattr(args, key)) for key in (*_NAMED_FLAGS, *OVERRIDABLE)
             if getattr(args, key, None) is not None}
    return changed_name(args.proposer or "medusa", given)


def _explicit_proposer(args: argparse.Namespace, target: str) -> dict:
    """The proposer table of the explicit form; flags that do not apply to the chosen proposer are refused."""
    proposer = {"name": args.proposer or "medusa"}
    given = [flag for flag in ("proposer_path", "tree", "num_speculative_tokens") if getattr(args, flag) is not None]
    if proposer["name"] == "none" and given:
        raise ValueError(f"--proposer none decodes plainly, so {flag(given[0])} does not apply; drop it")
    if args.tree is not None and proposer["name"] != "medusa":
        raise ValueError(f"--tree applies to --proposer medusa only, not {proposer['name']!r}; drop --tree")
    if args.num_speculative_tokens is not None:
        proposer["num_speculative_tokens"] = args.num_speculative_tokens
    if args.tree:
        proposer["tree"] = args.tree
    if args.proposer_path:
        proposer["path"] = args.proposer_path
    if proposer["name"] == "medusa":
        if "path" not in proposer:
            if target != REFERENCE_TARGET:
                raise ValueError(f"--proposer medusa with --target {target} needs --proposer-path (its Medusa heads)")
            proposer["path"] = REFERENCE_MEDUSA
        if "tree" not in proposer and "num_speculative_tokens" not in proposer:
            if proposer["path"] != REFERENCE_MEDUSA:
                raise ValueError("--proposer medusa needs --num-speculative-tokens K (a chain) or --tree NAME|FILE")
            proposer["tree"] = REFERENCE_TREE
    return proposer


def _explicit_case(args: argparse.Namespace) -> Case:
    """The case the explicit flags describe; what is left out takes the shipped defaults: the reference
    target, its Medusa heads and their calibrated tree, and Case's own defaults for the run settings."""
    if not args.prompts:
        raise ValueError("--prompts NAME|FILE is required in the explicit form (e.g. --prompts gsm8k)")
    if args.k:
        raise ValueError("-k selects cases of a suite, and the explicit form runs the one case its flags "
                         "describe; drop -k")
    target = args.target or REFERENCE_TARGET
    prompts = {"name": args.prompts}
    if args.num_prompts:
        prompts["num_prompts"] = args.num_prompts
    if args.prompts == "gsm8k":
        # the reference models were trained on zero-shot "Question: ...\nAnswer:" text
        prompts["n_shot"] = args.n_shot if args.n_shot is not None else (0 if target.startswith("specbench-ref/") else 1)
    elif args.n_shot is not None:
        raise ValueError(f"--n-shot applies to --prompts gsm8k only, not {args.prompts!r}; drop --n-shot")
    d = _EXPLICIT_DEFAULTS
    return Case.from_dict({
        "name": explicit_name(args), "suite": "cli", "target": target,
        "proposer": _explicit_proposer(args, target), "prompts": prompts,
        "sampling": {"temperature": args.temperature if args.temperature is not None else 0.0},
        "dtype": args.dtype or d.dtype, "device": args.device or d.device, "engine": args.engine or d.engine,
        "max_new_tokens": args.max_new_tokens or d.max_new_tokens,
        "seed": args.seed if args.seed is not None else d.seed, "ignore_eos": bool(args.ignore_eos),
        "batch_size": args.batch_size, "tensor_parallel": args.tensor_parallel,
    }, origin="the explicit form")
