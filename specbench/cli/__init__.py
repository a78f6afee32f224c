"""The ``specbench`` command: run cases and suites, manage baselines, print the environment."""

from __future__ import annotations

import sys

from specbench.cli.baselines_command import cmd_baselines_migrate, cmd_baselines_regenerate, cmd_baselines_show
from specbench.cli.env_command import cmd_env
from specbench.cli.errors import user_errors
from specbench.cli.parser import (
    BASELINES_HELP,
    EPILOG,
    RUN_DESCRIPTION,
    RUN_SETTINGS_HELP,
    OneLineErrorParser,
    UsageError,
    build_parser,
)
from specbench.cli.run_command import (
    DEFAULT_SUITE,
    EXPLICIT_FLAGS,
    REFERENCE_MEDUSA,
    REFERENCE_TARGET,
    REFERENCE_TREE,
    cmd_run,
    exit_status,
    gate_lines,
    gate_results,
    lossless_report,
    results_table,
)

__all__ = [
    "BASELINES_HELP", "DEFAULT_SUITE", "EPILOG", "EXPLICIT_FLAGS", "REFERENCE_MEDUSA", "REFERENCE_TARGET",
    "REFERENCE_TREE", "RUN_DESCRIPTION", "RUN_SETTINGS_HELP", "OneLineErrorParser", "UsageError", "build_parser",
    "cmd_baselines_migrate", "cmd_baselines_regenerate", "cmd_baselines_show", "cmd_env", "cmd_run", "exit_status", "gate_lines",
    "gate_results", "lossless_report", "main", "results_table",
]


def _quiet_libraries() -> None:
    """-q, of any command: no progress bars from the libraries either (transformers' weight loading,
    huggingface_hub's downloads), nor transformers' warnings."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    disable_progress_bars()


def main(argv: list[str] | None = None) -> int:
    from specbench.report.arguments import one_line

    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "quiet", False):
            _quiet_libraries()
        return args.func(args)
    except UsageError as err:
        print(err, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: one line, not the traceback of wherever the run was; --output, baselines and history records
        # are each written whole (atomically, or appended with signals held) or not at all
        print("\nspecbench: interrupted; what the run had not yet written was not written", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended
    except user_errors() as err:
        print(f"specbench: error: {one_line(err)}", file=sys.stderr)
        return 2
