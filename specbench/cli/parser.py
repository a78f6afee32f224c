"""The ``specbench`` argument parser: its subcommands, argument groups and help texts, and one-line usage errors."""

from __future__ import annotations

import argparse

from specbench.cases import DTYPE_NAMES, ENGINE_NAMES, builtin_suites
from specbench.cli.arguments import argument_type, list_argument_type, parse_device
from specbench.cli.bisect_command import BISECT_DESCRIPTION, cmd_bisect
from specbench.cli.compare_command import COMPARE_DESCRIPTION, add_ab_arguments, cmd_compare
from specbench.cli.baselines_command import cmd_baselines_migrate, cmd_baselines_regenerate, cmd_baselines_show
from specbench.cli.env_command import cmd_env
from specbench.cli.run_command import DEFAULT_SUITE, REFERENCE_MEDUSA, REFERENCE_TARGET, REFERENCE_TREE, cmd_run
from specbench.cli.sweep_command import SWEEP_DESCRIPTION, cmd_sweep

EPILOG = """examples:
  specbench run                                  # the default suite on CPU, no download
  specbench run demo/tiny-ngram-k3               # one case of a suite
  specbench run medusa/chain-k3 --num-prompts 2 --max-new-tokens 8   # a quick look (no baseline: see run --help)
  specbench run --prompts gsm8k --num-prompts 80      # reference target + Medusa heads + calibrated tree
  specbench run --proposer ngram --num-speculative-tokens 4 --prompts prompts.jsonl --output result.json
  specbench sweep medusa/chain-k3 --engine static --batch-sizes 1,2,4 --num-speculative-tokens 1,2,3
                                                 # throughput per batch size x K, the best K per batch size
  specbench report                               # the dashboard of every run recorded so far
  specbench env                                  # the environment fingerprint as JSON

exit status: 0 every gate passed, 1 a regression or a failed lossless check, 2 bad input
"""

RUN_DESCRIPTION = f"""\
Run plain and speculative decoding through the same engine; report acceptance rate,
mean acceptance length, per-position acceptance, tokens/s and speedup; check greedy output token for
token; gate the results against the stored baselines; and append them to the results history that
`specbench report` renders.

Two forms:
  SUITE | SUITE/CASE | FILE.toml   stored cases (no argument: the CPU cases of the '{DEFAULT_SUITE}' suite;
                                   built-in suites: {', '.join(builtin_suites())})
  --target/--proposer/--proposer-path/--tree/--num-speculative-tokens/--prompts
                                   the explicit form: one new case, cli/NAME (--prompts is required)

Overrides: --max-new-tokens, --num-prompts, --n-shot, --temperature, --seed, --ignore-eos, --dtype,
--device, --engine, --batch-size and --tensor-parallel change the stored cases they run. A changed case is renamed after its changes, e.g.
medusa/chain-k3[max_new_tokens=8,num_prompts=2], so it is never gated against the unmodified case's
baseline: it has no baseline (only its lossless check decides the exit status), --update-baselines refuses
it, and the history records it under its own name.

exit status: 0 every gate passed, 1 a regression or a failed lossless check, 2 bad input (a flag, a case,
prompt, checkpoint, baseline or history file)
"""


class UsageError(Exception):
    """A command line that argparse refused: printed as one line, exit status 2."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a refused command line is one line on stderr (flag, value, what is expected), not the
    whole usage block; main() turns it into exit status 2. Subcommand parsers inherit the class."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message} (see `{self.prog} --help`)")


def _parse_proposer(text: str) -> str:
    """argparse ``type=`` for --proposer: a registered proposer or "none" (plain decoding only)."""
    from specbench.proposers.registry import ENTRY_POINT_GROUP, available_proposers

    known = sorted({"none", *available_proposers()})
    if text not in known:
        raise argparse.ArgumentTypeError(f"unknown proposer {text!r}; expected one of {', '.join(known)} (plug-ins "
                                         f"register under the entry-point group {ENTRY_POINT_GROUP!r})")
    return text


BASELINES_HELP = "baseline directory (default: $SPECBENCH_BASELINES_DIR or <repo>/baselines)"
# "the case's" default: in the stored-case form a flag left out keeps the case's setting
RUN_SETTINGS_HELP = {
    "num_prompts": "use the first N prompts of the set (default: the case's; the whole set in the explicit form)",
    "n_shot": "GSM8K worked examples per prompt, gsm8k prompts only (default: the case's; in the explicit form 0 "
              "for specbench-ref targets, else 1)",
    "max_new_tokens": "tokens to generate per prompt (default: the case's; 64 in the explicit form)",
    "temperature": "sampling temperature: 0 is greedy, where the lossless check applies; above 0 the run samples, "
                   "verified by lossless rejection sampling (default: the case's; 0 in the explicit form)",
    "seed": "random seed: prompt i is decoded with seed N + i, plainly and speculatively alike (default: the case's; "
            "0 in the explicit form)",
    "ignore_eos": "always generate --max-new-tokens tokens, past end-of-sequence (default: the case's; off in the "
                  "explicit form)",
    "dtype": "weights and activations dtype; bfloat16/float16 runs are judged by a minimum match fraction, not "
             "exactness (default: the case's; float32 in the explicit form)",
    "device": "torch device: cpu, cuda, cuda:N or mps; refused when this machine lacks it (default: the case's; "
              "cpu in the explicit form)",
    "engine": "target engine: eager (HFTarget, any transformers causal LM) or static (StaticTarget: Llama, Mistral, "
              "Qwen2 on a preallocated cache, one CUDA graph per verify width on GPUs; docs/engines.md) "
              "(default: the case's; eager in the explicit form)",
    "batch_size": "decode N requests together in the static engine's N slots (needs --engine static): plain and "
                  "speculative at the same N, with throughput and batch speedup (docs/batching.md) (default: the "
                  "case's; unset, one request at a time, in the explicit form)",
    "tensor_parallel": "shard the target over N ranks (needs --engine static, a Llama-family target whose head "
                       "counts divide by N; not with --batch-size): specbench launches the ranks itself (gloo on "
                       "the CPU, NCCL with one GPU per rank), or joins torchrun's when run under it "
                       "(docs/tensor_parallel.md) (default: the case's; unset, one process)",
}


def _add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the commands that run cases: -k selection, the baseline directory, quiet."""
    parser.add_argument("-k", dest="k", metavar="EXPR",
                        help="only the cases whose name contains one of these comma-separated words ('not w' excludes)")
    parser.add_argument("--baselines", metavar="DIR", help=BASELINES_HELP)
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bars (specbench's, nor transformers' weight loading, nor hub downloads)")


def _add_explicit_arguments(run: argparse.ArgumentParser) -> None:
    explicit = run.add_argument_group("the explicit form (a new case, cli/NAME; not with SUITE|CASE)")
    explicit.add_argument("--target", metavar="REF", help="target model: a local directory, a hub id (org/name) or "
                          f"specbench-ref/... (default {REFERENCE_TARGET})")
    explicit.add_argument("--proposer", type=_parse_proposer, metavar="NAME",
                          help="none (plain decoding only), medusa, ngram, draft, eagle, eagle3, or a plug-in (default medusa)")
    explicit.add_argument("--proposer-path", metavar="REF", help="the proposer's checkpoint, e.g. Medusa heads: a "
                          f"directory or hub id (default {REFERENCE_MEDUSA} with the reference target)")
    explicit.add_argument("--num-speculative-tokens", type=argument_type("num_speculative_tokens"), metavar="K",
                          help="draft tokens per step, a chain of K (medusa, ngram, draft)")
    explicit.add_argument("--tree", metavar="NAME|FILE", help="Medusa tree: a shipped or published tree name (e.g. "
                          f"{REFERENCE_TREE}, mc_sim_7b_63) or a JSON file of paths (default {REFERENCE_TREE} with "
                          "the reference heads and no --num-speculative-tokens)")
    explicit.add_argument("--prompts", metavar="NAME|FILE", help="required: a prompt set (gsm8k, gsm8k-embedded, "
                          "spec_bench, spec_bench/<task>, mt_bench, synthetic) or a JSONL file")
    explicit.add_argument("--name", type=argument_type("name", str),
                          help="the case name, its id being cli/NAME (default: the proposer named after the "
                          "settings given, e.g. ngram[num_speculative_tokens=2,prompts=gsm8k], so that runs of "
                          "different settings are different cases)")


def _add_setting_arguments(run: argparse.ArgumentParser, *, batch_size: bool = True,
                           title: str = "run settings (both forms; on stored cases, overrides)") -> None:
    settings = run.add_argument_group(title)
    h = RUN_SETTINGS_HELP
    settings.add_argument("--num-prompts", type=argument_type("num_prompts"), metavar="N", help=h["num_prompts"])
    settings.add_argument("--n-shot", type=argument_type("n_shot"), metavar="N", help=h["n_shot"])
    settings.add_argument("--max-new-tokens", type=argument_type("max_new_tokens"), metavar="N",
                          help=h["max_new_tokens"])
    settings.add_argument("--temperature", type=argument_type("temperature", float), metavar="T", help=h["temperature"])
    settings.add_argument("--seed", type=argument_type("seed"), metavar="N", help=h["seed"])
    settings.add_argument("--ignore-eos", action="store_true", default=None, help=h["ignore_eos"])
    settings.add_argument("--dtype", choices=DTYPE_NAMES, help=h["dtype"])
    settings.add_argument("--device", type=parse_device, help=h["device"])
    settings.add_argument("--engine", choices=ENGINE_NAMES, help=h["engine"])
    if batch_size:
        settings.add_argument("--batch-size", type=argument_type("batch_size"), metavar="N", help=h["batch_size"])
        settings.add_argument("--tensor-parallel", type=argument_type("tensor_parallel"), metavar="N",
                              help=h["tensor_parallel"])


def _add_output_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--output", metavar="FILE", help="write the full result JSON here, atomically (one result, or "
                     "{\"results\": [...]} for several)")
    _add_selection_arguments(run)
    run.add_argument("-v", "--verbose", action="store_true", help="every check of every case, and each skipped "
                     "case's reason (default: a line per case, its problems, and one summary line per kind of skip)")
    run.add_argument("--threads", type=argument_type("num_prompts"), metavar="N", help="torch's CPU threads "
                     "(default: $OMP_NUM_THREADS, else the cores this process may use less those other processes keep "
                     "busy, so that a busy neighbour does not starve one of them; docs/metrics.md#cpu-threads)")
    run.add_argument("--no-gate", action="store_true", help="report only: do not compare with the stored baselines "
                     "(the lossless check still decides the exit status)")
    run.add_argument("--update-baselines", action="store_true", help="store the results as the cases' baselines "
                     "instead of gating them (needs --reason; refused when a lossless check fails, and for "
                     "overridden cases)")
    run.add_argument("--reason", metavar="TEXT", help="with --update-baselines, required: why the baselines change, "
                     "recorded in their provenance")
    history = run.add_mutually_exclusive_group()
    history.add_argument("--history", metavar="DIR", help="the results history to append the runs and their gate "
                         "outcomes to (default: $SPECBENCH_HISTORY_DIR or <repo>/.specbench/history, where "
                         "`specbench report` reads)")
    history.add_argument("--no-history", action="store_true", help="record the runs in no results history")


def _add_run_command(sub) -> None:
    run = sub.add_parser(
        "run", help="run a suite, one case, or an explicit target/proposer/prompts combination",
        description=RUN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("spec", nargs="?", metavar="SUITE|CASE",
                     help=f"a suite, SUITE/CASE, or a .toml case file (default: the CPU cases of '{DEFAULT_SUITE}')")
    _add_explicit_arguments(run)
    _add_setting_arguments(run)
    _add_output_arguments(run)
    run.set_defaults(func=cmd_run)


def _add_sweep_command(sub) -> None:
    sweep = sub.add_parser(
        "sweep", help="run one case over batch sizes x draft lengths; the best K per batch size",
        description=SWEEP_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument("spec", metavar="SUITE/CASE|FILE.toml",
                       help="the one case to sweep (a batch_sizes case by its own name: its sizes are the default grid)")
    sweep.add_argument("--batch-sizes", type=list_argument_type("batch_size"), metavar="B,B,...",
                       help="batch sizes, e.g. 1,2,4,8 (default: the case's batch_sizes, else its batch_size, else 1)")
    sweep.add_argument("--num-speculative-tokens", type=list_argument_type("num_speculative_tokens"),
                       metavar="K,K,...", help="draft lengths of a chain proposer, e.g. 1,2,3,5 (default: the case's "
                       "own draft; refused for tree and plain cases)")
    _add_setting_arguments(sweep, batch_size=False, title="run settings (overrides of the case, at every point)")
    sweep.add_argument("--output", metavar="FILE", help="write the grid as JSON here, atomically: every point's "
                       "metrics and lossless check, and the best K per batch size")
    sweep.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sweep.set_defaults(func=cmd_sweep, tensor_parallel=None)  # batch sizes above 1 are not sharded


def _add_baselines_command(sub) -> None:
    baselines = sub.add_parser("baselines", help="show or regenerate stored baselines")
    baselines_sub = baselines.add_subparsers(dest="baselines_command", required=True)
    regenerate = baselines_sub.add_parser(
        "regenerate",
        help="re-run a suite's cases and store their results as baselines",
        description="Re-run the cases and store each result as its baseline, atomically, printing an old -> new "
        "diff per metric. Quality metrics are stored once; speed metrics under this machine's hardware class. "
        "A run whose lossless check fails is refused. Re-basing is deliberate: --reason is required and recorded "
        "in each stored entry's provenance (runs gate against the committed baselines; none regenerates them).",
    )
    regenerate.add_argument("--reason", metavar="TEXT", help="required: why the baselines change (e.g. \"new verify "
                            "kernel, measured faster\"), recorded in each stored entry's provenance and printed "
                            "with the diff")
    regenerate.add_argument("suite", nargs="?", help=f"suite name or .toml file (default: {DEFAULT_SUITE}; "
                            "with --from-results: only that suite's results, default all)")
    regenerate.add_argument("--from-results", nargs="+", metavar="FILE",
                            help="store results already measured instead of re-running: pytest --specbench-results "
                            ".jsonl files or specbench run --output files (e.g. from a GPU job); the last result "
                            "of each case wins; speed goes under the hardware class the result records")
    _add_selection_arguments(regenerate)
    regenerate.set_defaults(func=cmd_baselines_regenerate)
    show = baselines_sub.add_parser("show", help="print the stored baselines")
    show.add_argument("suite", nargs="?", help="only this suite's cases (default: every stored suite)")
    show.add_argument("--baselines", metavar="DIR", help=BASELINES_HELP)
    show.set_defaults(func=cmd_baselines_show)
    migrate = baselines_sub.add_parser(
        "migrate", help="rewrite baseline files of an older format at the current one",
        description="Upgrade every <suite>.json of an older schema in place (atomically): what an old file "
        "did not record becomes null and its gates skip until the case is regenerated, or is computed from what "
        "it did record (T(1) from its repeat records); nothing it held changes. "
        "Older files are also read as the current schema without this, so it only saves the rewrite.")
    migrate.add_argument("--baselines", metavar="DIR", help=BASELINES_HELP)
    migrate.set_defaults(func=cmd_baselines_migrate)


def _add_compare_commands(sub) -> None:
    compare = sub.add_parser(
        "compare", help="A/B: did my change slow it down? the head against a base commit, on this machine",
        description=COMPARE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compare.add_argument("base", metavar="BASE", help="the base commit (branch, tag or hash)")
    compare.add_argument("cases", nargs="+", metavar="CASE", help="SUITE/CASE or SUITE, as `specbench run` takes them")
    compare.add_argument("--head", metavar="REV", help="the head commit (default: the working tree as it is now, "
                         "uncommitted changes to tracked files included)")
    add_ab_arguments(compare)
    _add_setting_arguments(compare, title="run settings (overrides of the cases, on both sides alike)")
    compare.add_argument("--output", metavar="FILE", help="write the comparison as JSON here, atomically: both "
                         "commits, each case's checks and every round's metrics")
    history = compare.add_mutually_exclusive_group()
    history.add_argument("--history", metavar="DIR", help="the results history the head's runs and their A/B "
                         "verdicts are appended to (default: $SPECBENCH_HISTORY_DIR or <repo>/.specbench/history)")
    history.add_argument("--no-history", action="store_true", help="record nothing in a results history")
    compare.add_argument("-v", "--verbose", action="store_true", help="every check of every case")
    compare.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    compare.set_defaults(func=cmd_compare)

    bisect = sub.add_parser(
        "bisect", help="find the commit that slowed a case down: git bisect judged by A/B runs",
        description=BISECT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bisect.add_argument("good", metavar="GOOD", help="a commit whose speed is right")
    bisect.add_argument("bad", metavar="BAD", help="a later commit that is slower")
    bisect.add_argument("case", metavar="CASE", help="the SUITE/CASE to measure")
    bisect.add_argument("--metric", default="tokens_per_s", metavar="NAME",
                        help="the speed metric whose A/B regression marks a commit bad (default tokens_per_s; "
                             "step_latency_s is T(1))")
    add_ab_arguments(bisect)
    _add_setting_arguments(bisect, title="run settings (overrides of the case, on every commit alike)")
    bisect.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    bisect.set_defaults(func=cmd_bisect)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="specbench",
        description="Test harness and regression benchmarks for speculative decoding: did acceptance, "
        "correctness or speed regress, and by how much?",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_command(sub)
    _add_sweep_command(sub)
    _add_compare_commands(sub)
    _add_baselines_command(sub)

    env = sub.add_parser("env", help="print the environment fingerprint stored with every result")
    env.add_argument("--device", default=None, help="device whose GPU to describe (default: cuda:0 if present)")
    env.set_defaults(func=cmd_env)

    from specbench.cli import calibrate_tree
    from specbench.report.arguments import add_report_subcommands
    from specbench.zoo.cli import add_zoo_subcommand

    calibrate_parser = sub.add_parser(
        "calibrate-tree", help="calibrate a Medusa tree for a checkpoint from measured head accuracies",
        description=calibrate_tree.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    calibrate_tree.add_arguments(calibrate_parser)
    calibrate_parser.set_defaults(func=calibrate_tree.run)
    add_report_subcommands(sub)
    add_zoo_subcommand(sub)
    return parser
