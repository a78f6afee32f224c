"""``specbench env``: print the environment fingerprint stored with every result."""

from __future__ import annotations

import argparse
import json


def cmd_env(args: argparse.Namespace) -> int:
    from specbench.env import environment_fingerprint

    print(json.dumps(environment_fingerprint(device=args.device), indent=2, sort_keys=True))
    return 0
