"""Running a case (docs/metrics.md): what a run loads from its case, its one-request, batched, tensor-parallel and
engine-under-test forms, the speed figures over its repeats, and the device faults one case may hit. The harness
(specbench/run/harness.py) is the one entry point both front ends call."""
