"""The pytest plugin's parts beside its entry point (specbench/pytest_plugin.py, pyproject's ``pytest11``): its A/B
mode, its GPU sharding under pytest-xdist and the rule of which GPUs each worker sees. Light to import: no torch."""
