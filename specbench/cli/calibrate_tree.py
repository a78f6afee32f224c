"""``specbench calibrate-tree``: a Medusa tree calibrated for a checkpoint from measured head accuracies."""

from __future__ import annotations

import argparse

from specbench.cases import DTYPE_NAMES, Case
from specbench.cli.arguments import argument_type, parse_device

DESCRIPTION = """``specbench calibrate-tree``: a Medusa tree calibrated for a given checkpoint, so users are not
stuck with trees tuned for Vicuna. Measures each head's top-k accuracy on the target's own greedy
continuations of a prompt set, grows a tree greedily by expected acceptance (Medusa's method) to a
node budget, and saves it as JSON with the measurements it came from."""  # the --help text

COUNT = argument_type("num_prompts")  # the case rule for "an integer >= 1", for the counts that are not case fields


def calibrate_for_checkpoint(case: Case, *, num_nodes: int, top_k: int = 10, progress: bool = True) -> tuple[list, dict]:
    """(tree paths, metadata) for the Medusa heads ``case.proposer["path"]`` on ``case.target``."""
    from specbench.run.harness import load_prompt_ids, load_target  # here: `specbench --help` loads no torch
    from specbench.medusa.checkpoint import load_medusa_heads
    from specbench.medusa.training import collect_self_distillation, head_topk_accuracy
    from specbench.medusa.tree_calibration import calibrate_tree, expected_acceptance_length, rank_accuracies

    target, tokenizer = load_target(case)
    heads = load_medusa_heads(
        case.proposer["path"], hidden_size=int(target.config.hidden_size), vocab_size=target.vocab_size, dtype=target.dtype
    ).to(target.device)
    prompts, source = load_prompt_ids(case, tokenizer, target.vocab_size)
    pad = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    hidden, tokens = collect_self_distillation(
        target.model, [ids for _, ids in prompts], case.max_new_tokens, pad_token_id=pad, progress=progress
    )  # (B, G + 1, H), (B, G + 1)
    cumulative = head_topk_accuracy(heads, hidden, tokens, top_k, lm_head=target.lm_head)  # (heads, k)
    accuracies = rank_accuracies(cumulative)  # (heads, k): P(true token is the rank-r candidate)
    paths = calibrate_tree(accuracies, num_nodes)
    metadata = {
        "target": case.target,
        "medusa": case.proposer["path"],
        "prompts": source,
        "num_prompts": len(prompts),
        "max_new_tokens": case.max_new_tokens,
        "num_nodes": num_nodes,
        "top1_accuracy": [round(float(x), 4) for x in cumulative[:, 0]],
        "topk_accuracy_cumulative": [[round(float(x), 4) for x in row] for row in cumulative],
        "expected_mean_acceptance_length": round(expected_acceptance_length(paths, accuracies), 4),
    }
    return paths, metadata


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags, each value checked at parse time (a bad one is refused naming the flag); defaults are written
    into the help by hand, so each shows once."""
    parser.add_argument("--target", required=True, metavar="REF",
                        help="required: target model reference (local dir, hub id, specbench-ref/...)")
    parser.add_argument("--medusa", required=True, metavar="REF",
                        help="required: Medusa heads checkpoint reference (any supported layout)")
    parser.add_argument("--prompts", required=True, metavar="NAME|FILE",
                        help="required: prompt set name or JSONL file to measure on")
    parser.add_argument("--num-prompts", type=argument_type("num_prompts"), default=80, metavar="N",
                        help="prompts to measure on (default 80)")
    parser.add_argument("--n-shot", type=argument_type("n_shot"), metavar="N",
                        help="GSM8K exemplars per prompt, --prompts gsm8k only (default 0)")
    parser.add_argument("--max-new-tokens", type=argument_type("max_new_tokens"), default=128, metavar="N",
                        help="greedy continuation length per prompt (default 128)")
    parser.add_argument("--nodes", type=COUNT, default=63, metavar="N",
                        help="tree size in nodes, an integer >= 1; the root is extra (default 63)")
    parser.add_argument("--top-k", type=COUNT, default=10, metavar="K",
                        help="candidates per head considered, an integer >= 1 (default 10)")
    parser.add_argument("--dtype", default="float32", choices=DTYPE_NAMES, help="dtype (default float32)")
    parser.add_argument("--device", default="cpu", type=parse_device,
                        help="torch device: cpu, cuda, cuda:N or mps (default cpu)")
    parser.add_argument("--output", required=True, metavar="FILE", help="required: tree JSON to write (atomically)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _prompts(args: argparse.Namespace) -> dict:
    prompts = {"name": args.prompts, "num_prompts": args.num_prompts}
    if args.prompts == "gsm8k":
        prompts["n_shot"] = args.n_shot if args.n_shot is not None else 0
    elif args.n_shot is not None:
        raise ValueError(f"--n-shot applies to --prompts gsm8k only, not {args.prompts!r}; drop --n-shot")
    return prompts


def run(args: argparse.Namespace) -> int:
    from specbench.medusa.tree_calibration import save_tree_json

    case = Case(
        name="calibration", suite="calibrate", target=args.target,
        proposer={"name": "medusa", "path": args.medusa}, prompts=_prompts(args),
        dtype=args.dtype, device=args.device, max_new_tokens=args.max_new_tokens,
    )
    paths, metadata = calibrate_for_checkpoint(case, num_nodes=args.nodes, top_k=args.top_k, progress=not args.quiet)
    save_tree_json(paths, args.output, metadata)
    print(f"per-head top-1 accuracy: {metadata['top1_accuracy']}")
    print(f"{len(paths)}-node tree, expected mean acceptance length {metadata['expected_mean_acceptance_length']:.2f}")
    print(f"wrote {args.output}; use it with --tree {args.output}")
    return 0
