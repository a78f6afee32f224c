"""The ``specbench zoo`` command line: build, eagle, install, summary, compare, list and synth of the reference
models (``python -m specbench.zoo.cli`` runs it without installing the package)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from specbench.zoo.config import SCALES
from specbench.references import DATA_DIR_ENV
from specbench.references import ARTIFACTS_DIR, BUILD_NAME, REFERENCES, references_root, resolve_reference


def headline(record: dict) -> str:
    """The numbers a person checks after a build, one per line."""
    acc, medusa = record["acceptance"], record["medusa"]
    lines = [
        f"zoo build {record['name']} ({record['scale']}, seed {record['seed']}, {record['device']}): "
        f"{'PASSED' if record['passed'] else 'FAILED'} in {record['wall_time_s']['total']:.0f} s",
        f"  target  {record['target']['num_parameters']:,} params, train loss {record['target']['final_loss']:.3f}, "
        f"held-out loss {record['target']['heldout_loss']:.3f}",
        "  medusa  top-1 " + "/".join(f"{x:.2f}" for x in medusa["top1_accuracy"])
        + ", top-5 " + "/".join(f"{x:.2f}" for x in medusa["top5_accuracy"]),
    ]
    for name, tree in record["trees"].items():
        lines.append(f"  tree {tree['name']}: {tree['num_nodes']} nodes, expected MAL {tree['expected_mean_acceptance_length']:.2f}")
    for name, result in acc.items():
        if isinstance(result, dict):
            lines.append(f"  measured {name}: acceptance {result['acceptance_rate']:.3f}, MAL {result['mean_acceptance_length']:.2f}, "
                         f"outputs match chain: {result['outputs_match_first']}")
    draft = record["draft"]
    lines.append(f"  draft   {draft['num_parameters']:,} params, top-1 agreement with target {draft['heldout_top1_agreement_with_target']:.3f}")
    lines += eagle_headline(record.get("eagle"))
    lines.append("  sizes   " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in record["sizes_bytes"].items()))
    lines += [f"  check {name}: {'ok' if ok else 'FAILED'}" for name, ok in record["checks"].items()]
    return "\n".join(lines)


def eagle_headline(section: dict | None) -> list[str]:
    """The EAGLE stage's numbers: held-out agreement per depth and each measured setting."""
    if not section:
        return []
    lines = [f"  eagle stage on {section['device']}: {section['wall_time_s']['total']:.0f} s, "
             f"{section['data']['num_sequences']:,} self-distilled sequences"]
    for name in ("eagle", "eagle3"):
        head = section[name]
        lines.append(f"  {name:<7} {head['num_parameters']:,} params, held-out top-1 per depth "
                     + "/".join(f"{x:.2f}" for x in head["heldout_top1_per_depth"]))
    for name, result in section["acceptance"].items():
        if isinstance(result, dict) and "mean_acceptance_length" in result:
            lines.append(f"  measured {name}: acceptance {result['acceptance_rate']:.3f}, MAL "
                         f"{result['mean_acceptance_length']:.2f}, lossless: {result['outputs_match_plain']}")
    return lines


def _default_device() -> str:
    import torch  # here, not at the top: `specbench --help` and `zoo list` load no torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cmd_build(args: argparse.Namespace) -> int:
    from specbench.zoo.registry import find_build_dir, install_build  # noqa: F401 - here: light --help
    from specbench.zoo.build import build_zoo
    from specbench.zoo.build_record import read_record

    config = SCALES[args.scale]
    overrides = {"vocab_size": args.vocab_size, "heads_steps": args.heads_steps, "eval_num_prompts": args.eval_prompts,
                 "num_answer_prefix_prompts": args.answer_prefix_prompts, "num_distill_only_records": args.distill_only_records}
    config = dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    for field, steps in (("target_training", args.target_steps), ("draft_training", args.draft_steps)):
        if steps is not None:
            config = dataclasses.replace(config, **{field: dataclasses.replace(getattr(config, field), steps=steps)})
    built = build_zoo(args.out_dir, config, scale=args.scale, data_dir=args.data_dir, device=args.device or _default_device(), seed=args.seed,
                      overwrite=args.overwrite, progress=not args.quiet)
    record = read_record(built)
    print(headline(record))
    print(f"wrote {built}")
    if args.install:
        if not record["passed"]:
            print(f"not installed: the build failed its checks; inspect {built}/build_record.json", file=sys.stderr)
            return 1
        print(f"installed into {install_build(built)}")
    return 0 if record["passed"] else 1


def cmd_eagle(args: argparse.Namespace) -> int:
    from specbench.zoo.registry import find_build_dir, install_build  # noqa: F401 - here: light --help
    from specbench.zoo.eagle_stage import SCALES as EAGLE_SCALES, add_eagle_heads, install_eagle_heads

    build = find_build_dir(args.build_dir)
    in_place = build.resolve() == (ARTIFACTS_DIR / BUILD_NAME).resolve()
    if in_place and not args.install:
        raise ValueError(f"{build} is the installed zoo (package data); pass --install to add the heads to it")
    config = EAGLE_SCALES[args.scale] if args.scale else None
    built, record = add_eagle_heads(build, config, data_dir=args.data_dir, device=args.device or _default_device(), overwrite=args.overwrite,
                                    require_pass=in_place and not args.force, progress=not args.quiet)
    print(headline(record))
    print(f"wrote {built / 'eagle'} and {built / 'eagle3'}; updated {built / 'build_record.json'}")
    if args.install and not in_place:
        if not record["passed"] and not args.force:
            print(f"not installed: the heads failed their checks; inspect {built}/build_record.json", file=sys.stderr)
            return 1
        print(f"installed into {install_eagle_heads(built, force=args.force)}")
    return 0 if record["passed"] else 1


def cmd_install(args: argparse.Namespace) -> int:
    from specbench.zoo.registry import find_build_dir, install_build  # noqa: F401 - here: light --help
    print(f"installed into {install_build(args.build_dir, force=args.force)}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from specbench.zoo.registry import find_build_dir, install_build  # noqa: F401 - here: light --help
    from specbench.zoo.build_record import read_record

    print(headline(read_record(find_build_dir(args.build_dir))))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from specbench.zoo.registry import find_build_dir, install_build  # noqa: F401 - here: light --help
    from specbench.zoo.build_record import compare_records, read_record

    reference_path = Path(args.reference) if args.reference else references_root() / BUILD_NAME
    reference, rebuild = read_record(find_build_dir(reference_path)), read_record(find_build_dir(args.rebuild))
    verdict = compare_records(reference, rebuild, names=(str(reference_path), args.rebuild))
    print(f"{reference['name']}: {reference['device']} build vs {rebuild['device']} rebuild, seed {rebuild['seed']}, "
          f"tolerance {verdict['tolerance']:.0%}")
    for row in verdict["rows"]:
        print(f"  {'ok  ' if row['ok'] else 'FAIL'} {row['metric']}: {row['reference']:.4f} -> {row['rebuild']:.4f} "
              f"({row['relative_change']:+.1%})")
    heads = [f"{a:.2f}->{b:.2f}" for a, b in zip(reference["medusa"]["top1_accuracy"], rebuild["medusa"]["top1_accuracy"])]
    print(f"  (per-head top-1: {', '.join(heads)})")
    print("reproduced" if verdict["reproduced"] else "NOT reproduced")
    return 0 if verdict["reproduced"] else 1


def cmd_synth(args: argparse.Namespace) -> int:
    from specbench.zoo.synth import run

    return run(args)


def cmd_list(args: argparse.Namespace) -> int:
    print(f"zoo directory: {references_root()}")
    for name in REFERENCES:
        try:
            print(f"  {name}: {resolve_reference(name)}")
        except FileNotFoundError:
            print(f"  {name}: not installed ({references_root() / 'gsm8k-tiny' / REFERENCES[name]})")
    return 0


def _add_zoo_commands(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="zoo_command", required=True)
    build = commands.add_parser(
        "build", help="train the GSM8K reference models (tokenizer, target, Medusa heads, trees, draft, EAGLE heads)",
        description="Train and package specbench's GSM8K reference models into OUT_DIR/gsm8k-tiny/ with a build "
        f"record. Reads GSM8K JSONL from --data-dir or ${DATA_DIR_ENV}; never downloads.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    build.add_argument("out_dir", help="output directory; the build goes to OUT_DIR/gsm8k-tiny/")
    build.add_argument("--data-dir", default=None, help=f"directory holding gsm8k/train.jsonl and gsm8k/test.jsonl (default ${DATA_DIR_ENV})")
    build.add_argument("--device", help="torch device: cuda (full scale, minutes) or cpu (default: cuda where there is one)")
    build.add_argument("--scale", choices=sorted(SCALES), default="full", help="full: the shipped models; test: a miniature for CPU tests")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--vocab-size", type=int, help="override the scale's BPE vocabulary size")
    build.add_argument("--target-steps", type=int, help="override the target's training steps")
    build.add_argument("--heads-steps", type=int, help="override the Medusa heads' training steps")
    build.add_argument("--draft-steps", type=int, help="override the draft's training steps")
    build.add_argument("--answer-prefix-prompts", type=int, help="override the extra self-distillation prompts (question + cut answer)")
    build.add_argument("--distill-only-records", type=int, help="override the train records kept for self-distillation only")
    build.add_argument("--eval-prompts", type=int, help="override the number of GSM8K test questions for the acceptance check")
    build.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR/gsm8k-tiny")
    build.add_argument("--install", action="store_true", help=f"when the build passes its checks, install it into {ARTIFACTS_DIR}")
    build.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    build.set_defaults(func=cmd_build)

    eagle = commands.add_parser(
        "eagle", help="train the EAGLE-1/2 and EAGLE-3 heads of a finished build and add them to it",
        description="Self-distil EAGLE-1/2 and EAGLE-3 draft heads for BUILD_DIR's target: regenerate the build's "
        "self-distillation prompts from its record (same seed and config), continue them greedily with the target, "
        "train both heads on the target's features (EAGLE-1: feature regression + cross-entropy; EAGLE-3: fused "
        "aux-layer features, a 1,536-token draft vocabulary, training-time test), write eagle/ and eagle3/ in the "
        "published layouts, read them back with the strict loaders and measure acceptance on the build's evaluation "
        "prompts (chain K=3, EAGLE-1 static tree, EAGLE-2 and EAGLE-3 dynamic trees, each checked token for token "
        "against plain decoding). Everything is staged in a temporary directory, then renamed into BUILD_DIR with its "
        "rewritten build_record.json; target/, medusa/, draft/ and trees/ are never written. About 20 minutes on 2 "
        f"CPU cores at full scale. Reads GSM8K JSONL from --data-dir or ${DATA_DIR_ENV}; never downloads. On a CPU "
        "shared with other jobs, run it with OMP_WAIT_POLICY=PASSIVE: spinning OpenMP threads slow small models' "
        "steps by up to 50x there.",
    )
    eagle.add_argument("build_dir", help="a finished build: OUT_DIR, OUT_DIR/gsm8k-tiny, or the installed "
                       f"{ARTIFACTS_DIR / BUILD_NAME} (with --install)")
    eagle.add_argument("--data-dir", default=None, help=f"directory holding the build's gsm8k/train.jsonl and test.jsonl (default ${DATA_DIR_ENV})")
    eagle.add_argument("--device", help="torch device for training and measurement (default: cuda where there is one, else cpu)")
    eagle.add_argument("--scale", choices=["full", "test"], default=None, help="the stage's size (default: the build's scale; test for custom builds)")
    eagle.add_argument("--overwrite", action="store_true", help="retrain heads the build already has")
    eagle.add_argument("--install", action="store_true", help="when the heads pass their checks, add eagle/, eagle3/ and "
                       "the record to the installed build (its other files must be byte-identical to BUILD_DIR's)")
    eagle.add_argument("--force", action="store_true", help="write or install heads that failed their checks")
    eagle.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    eagle.set_defaults(func=cmd_eagle)

    install = commands.add_parser("install", help="copy a finished build into the package's zoo directory (atomically)")
    install.add_argument("build_dir", help="OUT_DIR of a build, or OUT_DIR/gsm8k-tiny")
    install.add_argument("--force", action="store_true", help="install even if the build failed its checks")
    install.set_defaults(func=cmd_install)

    summary = commands.add_parser("summary", help="print the headline numbers of a finished build")
    summary.add_argument("build_dir", help="OUT_DIR of a build, or OUT_DIR/gsm8k-tiny")
    summary.set_defaults(func=cmd_summary)

    compare = commands.add_parser(
        "compare", help="check that a rebuild reproduces a build's quality metrics within the tolerance its record states",
        description="Compare two build records (same seed and scale): CPU builds must match exactly, CUDA builds "
        "within the record's reproducibility.cuda_quality_tolerance. Exit 1 when not reproduced.")
    compare.add_argument("rebuild", help="the rebuild: OUT_DIR, OUT_DIR/gsm8k-tiny or a build_record.json")
    compare.add_argument("--reference", help="the build to reproduce (default: the installed gsm8k-tiny)")
    compare.set_defaults(func=cmd_compare)

    listing = commands.add_parser("list", help="zoo names and the paths they resolve to")
    listing.set_defaults(func=cmd_list)

    from specbench.zoo import synth_command as synth

    synthetic = commands.add_parser("synth", help="write a Vicuna-7B-shaped random Llama and upstream-layout Medusa heads",
                                    description=synth.__doc__)
    synth.add_arguments(synthetic)
    synthetic.set_defaults(func=cmd_synth)


def add_zoo_subcommand(subparsers) -> argparse.ArgumentParser:
    """Add ``zoo {build,eagle,install,summary,compare,list,synth}`` to a CLI's subparsers; each sets ``func(args) -> int``."""
    zoo = subparsers.add_parser("zoo", help="build, install and locate specbench's own reference models",
                                description="specbench's own small GSM8K reference models (target, Medusa heads, trees, "
                                "draft, EAGLE-1/2 and EAGLE-3 heads).")
    _add_zoo_commands(zoo)
    return zoo


def main(argv: list[str] | None = None) -> int:
    """``python -m specbench.zoo.cli {build,eagle,install,summary,list} ...`` (the same as ``specbench zoo``)."""
    parser = argparse.ArgumentParser(prog="python -m specbench.zoo.cli", description=add_zoo_subcommand.__doc__)
    _add_zoo_commands(parser)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"specbench zoo: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
