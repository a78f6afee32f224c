"""specbench's own small reference models (the "zoo"): built by ``specbench zoo build``, shipped as
package data, and found by short names such as ``specbench-ref/gsm8k-tiny``."""

from specbench.zoo.registry import ZooArtifactMissing, resolve_zoo_ref, zoo_names

__all__ = ["ZooArtifactMissing", "resolve_zoo_ref", "zoo_names"]
