"""The kernels max-autotune mode chose for the one-row matmuls in this process, recorded in a result's details.

Autotuning benchmarks candidate Triton and ATen kernels per matmul shape and keeps the fastest; two fresh processes
can choose differently, which moves T(1) (docs/ab.md#what-moves-a-speed-figure). Inductor selects in two places:
at lowering (its feedback hook) and, for templates whose choice waits for epilogue fusion, in the scheduler
(``MultiTemplateBuffer.get_min_choice``); both are recorded. Inductor's caches on disk (``TORCHINDUCTOR_CACHE_DIR``)
hand a later process the earlier one's compiled code: when its FX graph cache serves a graph, nothing is selected
in this process, and :func:`describe` gives the cache's hits and misses instead. In every process it also names
the matmul kernels the loaded compiled graphs run, read from their generated code (``compiled_matmuls``): on a
GPU a one-row matmul is a multiply-and-sum reduction there, which no selection hook sees (docs/ab.md).
"""

from __future__ import annotations

import math

import torch

from specbench.run.compiled_matmuls import ROW_MM_LABEL, compiled_matmuls

_SELECTIONS: dict[tuple, dict] = {}  # (op, shapes) -> the selection's record, in the order first seen
_INSTALLED = False


def install() -> None:
    """Start recording autotune selections in this process (once; later calls do nothing)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from torch._inductor.select_algorithm import add_feedback_saver

    add_feedback_saver(_record)
    _record_deferred_choices()
    _INSTALLED = True


def _record_deferred_choices() -> None:
    """Wrap the scheduler's pick of a deferred template (torch without it: nothing to wrap)."""
    from torch._inductor import ir

    template = getattr(ir, "MultiTemplateBuffer", None)
    original = getattr(template, "get_min_choice", None)
    if original is None or getattr(original, "_specbench_recorded", False):
        return

    def get_min_choice(self, *args, **kwargs):
        chosen = original(self, *args, **kwargs)
        try:  # a record, never a reason for the compile to fail (another torch's buffer may differ)
            timings = self.choice_timings(*args, **kwargs)  # computed once per buffer and hint: read back
            _record(timings, "template", list(getattr(self, "inputs", []) or []), list(timings))
        except Exception:  # noqa: BLE001 - the record is best effort
            pass
        return chosen

    get_min_choice._specbench_recorded = True
    template.get_min_choice = get_min_choice


def _shape(node) -> list:
    """An inductor input node's size as ints where they are static (strings where symbolic)."""
    try:
        return [int(s) if str(s).isdigit() else str(s) for s in node.get_size()]
    except Exception:  # a node without a size: keep the record, drop the shape
        return []


def _record(timings: dict, name: str, input_nodes: list, choices: list, *_unused) -> None:
    """Feedback hook of inductor's algorithm selection: keep the winner and the runner-up of one selection."""
    ranked = sorted(((t, c) for c, t in timings.items() if math.isfinite(t)), key=lambda tc: tc[0])
    if not ranked:
        return
    shapes = [_shape(node) for node in input_nodes]
    best_time, best = ranked[0]
    _SELECTIONS[(name, repr(shapes))] = {
        "op": name,
        "input_shapes": shapes,
        "chosen": selection_label(best),
        "chosen_ms": round(best_time, 5),
        "runner_up": selection_label(ranked[1][1]) if len(ranked) > 1 else None,
        "runner_up_ms": round(ranked[1][0], 5) if len(ranked) > 1 else None,
        "candidates": len(choices),
    }


def selection_label(choice) -> str:
    """A choice's name with its configuration (block sizes, warps, stages), as inductor describes it."""
    description = getattr(choice, "description", "") or ""
    return f"{choice.name} ({description})" if description else str(choice.name)


def selections() -> list[dict]:
    """Every selection recorded in this process so far, one per (op, input shapes)."""
    return [dict(record) for record in _SELECTIONS.values()]


def weight_shapes(*modules: torch.nn.Module | None) -> set[tuple[int, ...]]:
    """The shapes of the 2-D weights of ``modules`` (fused ones included), which tell their matmuls from others."""
    return {tuple(m.weight.shape) for module in modules if module is not None for m in module.modules()
            if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2}


def case_modules(target, proposer) -> list:
    """The modules a case runs: its target's, and its proposer's draft model, Medusa heads or EAGLE head (inside a
    tensor-parallel run's rank-0 wrapper too)."""
    proposer = getattr(proposer, "inner", proposer)
    draft = getattr(proposer, "draft", None)
    return [getattr(target, "module", None), getattr(draft, "module", None), getattr(proposer, "heads", None),
            getattr(proposer, "head", None)]


def describe(*modules: torch.nn.Module | None) -> dict:
    """The ``autotune`` entry of a result's engine details (docs/ab.md#what-moves-a-speed-figure): the selections,
    the compiled graphs' matmul kernels and inductor's FX graph cache hits and misses so far in this process. Given
    the case's ``modules`` (its target's, its draft model's), the selections and kernels are only theirs: those
    with an input of one of their weights' shapes."""
    if not _INSTALLED:
        return {"selections": [], "note": "no max-autotuned matmuls in this process"}
    from torch._dynamo.utils import counters

    cache = {"hits": int(counters["inductor"]["fxgraph_cache_hit"]), "misses": int(counters["inductor"]["fxgraph_cache_miss"])}
    shapes = weight_shapes(*modules) if modules else None
    recorded = [r for r in selections() if shapes is None or shapes & {tuple(s) for s in r["input_shapes"]}]
    if recorded:
        note = "selections inductor made in this process (benchmarked now, or timings from its autotune cache)"
    elif cache["misses"]:
        note = (f"inductor compiled {cache['misses']} graphs in this process and reported no autotune selection to "
                "its hooks")
    else:
        note = (f"no autotune selection in this process; inductor's FX graph cache served {cache['hits']} of its "
                f"{cache['hits'] + cache['misses']} compiled graphs (compiled, kernel choices included, by an earlier "
                "process on this machine)")
    matmuls = compiled_matmuls(shapes)
    if any(ROW_MM_LABEL in kernel for record in matmuls for kernel in record["kernels"]):
        note += ("; the one-row matmuls run as multiply + sum reductions (coordinate-descent tuning's decomposition), "
                 "which select no mm kernel")
    note += "; compiled_matmuls names the kernels the loaded graphs run, read from their generated code"
    return {"selections": recorded, "compiled_matmuls": matmuls, "fx_graph_cache": cache, "note": note}


def clear() -> None:
    """Forget the recorded selections (tests)."""
    _SELECTIONS.clear()
