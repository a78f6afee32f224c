"""Repository-level pytest configuration: load specbench's plugin from this source tree when the
package is not pip-installed (e.g. a GPU machine that runs the checkout with PYTHONPATH=.); an
installed specbench registers it through its ``pytest11`` entry point, and loading it twice fails."""

from importlib.metadata import entry_points

if not any(ep.value == "specbench.pytest_plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["specbench.pytest_plugin"]
