"""The matmul kernels in this process's compiled graphs, read from inductor's generated code (docs/ab.md).

Inductor writes every compiled graph as a Python module (its "output code") and loads it through its
``PyCodeCache``, whether it compiled the graph here or its FX graph cache served it from an earlier process. The
module's ``call`` names the kernel each matmul runs: ``extern_kernels.mm`` (ATen, cuBLAS on a GPU), a Triton
template (``triton_tem_*``) whose source carries the block sizes, warps and stages autotuning picked, or, for a
one-row matmul on a GPU compiled with coordinate-descent tuning (which max-autotune mode turns on), no mm at all:
inductor's decomposition rewrites ``x @ W.T`` with one row as a multiply and a sum, one Triton reduction kernel
whose block sizes and warps coordinate descent picks at its first launch, so those are read from the loaded
kernel's launcher. That kernel keeps the mm as its origin: inductor names kernels after the ATen ops before
decomposition (``triton_red_fused_mm_0``) and writes them in the comment above each definition
(``# ... Original ATen: [aten.mm]``). No template selection happens there, which is why inductor's
selection hooks (``kernel_choices``) record nothing for these matmuls (docs/ab.md#what-moves-a-speed-figure).
"""

from __future__ import annotations

import re
from pathlib import Path

_SHAPE = re.compile(r"assert_size_stride\((\w+), \(([\d, ]*)\)")
_EXTERN = re.compile(r"\bextern_kernels\.(\w*mm)\(")
_TEMPLATE_CALL = re.compile(r"\b(triton_tem_\w+)\.run\(")
_CONSTEXPR = re.compile(r"\b(BLOCK_\w+|GROUP_M|EVEN_K)\s*:\s*tl\.constexpr\s*=\s*(\w+)")
_LAUNCH = re.compile(r"\b(num_stages|num_warps)\s*=\s*(\d+)")
ROW_MM_LABEL = "one-row mm as multiply + sum"  # how a record names the reduction (kernel_choices' note reads it)
# a reduction kernel's definition with the ATen ops it came from, in the comment inductor writes above it
_REDUCTION_DEF = re.compile(r"Original ATen: \[([^\]]*)\]\n(?:#[^\n]*\n)*(triton_(?:red|per)_\w+) = async_compile\.triton\(")
_MATMUL_OPS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"}
QUOTES = "'" * 3  # what opens and closes a kernel's source in the generated module


def _template_config(source: str, name: str) -> str:
    """``name``'s configuration from its definition in ``source``: its constexpr block sizes, warps and stages."""
    start = source.find(f"{name} = async_compile.triton(")
    opening = source.find(QUOTES, start) if start >= 0 else -1
    closing = source.find(QUOTES, opening + len(QUOTES)) if opening >= 0 else -1
    if closing < 0:
        return ""
    body = source[opening:closing]  # the kernel's source, between its triple quotes
    settings = dict(_LAUNCH.findall(body)) | dict(_CONSTEXPR.findall(body))
    return ", ".join(f"{key}={value}" for key, value in sorted(settings.items()))


def _row_matmuls(source: str) -> list[str]:
    """The reduction kernels ``source`` runs that came from a matmul: a one-row mm decomposed to multiply + sum."""
    return [name for origins, name in _REDUCTION_DEF.findall(source)
            if _MATMUL_OPS & {op.strip() for op in origins.split(",")} and f"{name}.run(" in source]


def launched_config(kernel) -> str:
    """A loaded Triton kernel's configuration as tuning left it (its one launcher's block sizes, warps, stages);
    "not launched yet" while it still holds several candidates, "" for anything else."""
    launchers = getattr(kernel, "launchers", None)
    if not isinstance(launchers, list) or not launchers:
        return ""
    if len(launchers) > 1:
        return "not launched yet"
    config = getattr(launchers[0], "config", None)
    settings = dict(getattr(config, "kwargs", None) or {})
    for key in ("num_warps", "num_stages"):
        if getattr(config, key, None) is not None:
            settings[key] = getattr(config, key)
    return ", ".join(f"{key}={value}" for key, value in sorted(settings.items()))


def matmuls_in(source: str, module=None) -> dict | None:
    """One generated module's matmuls: its input shapes and the kernels its ``call`` runs; ``None`` without one.
    ``module``: the loaded module, whose reduction kernels say the configuration their tuning chose."""
    kernels = [f"aten {op}" for op in dict.fromkeys(_EXTERN.findall(source))]
    for name in dict.fromkeys(_TEMPLATE_CALL.findall(source)):
        config = _template_config(source, name)
        kernels.append(f"{name} ({config})" if config else name)
    for name in dict.fromkeys(_row_matmuls(source)):
        config = launched_config(getattr(module, name, None))
        kernels.append(f"{name} ({ROW_MM_LABEL}" + (f": {config})" if config else ")"))
    if not kernels:
        return None
    shapes = [[int(s) for s in dims.replace(" ", "").split(",") if s] for _, dims in _SHAPE.findall(source)]
    return {"input_shapes": shapes, "kernels": kernels}


def compiled_matmuls(weight_shapes: set[tuple[int, ...]] | None = None) -> list[dict]:
    """Every distinct (input shapes, kernels) of the generated modules loaded in this process so far; with
    ``weight_shapes``, only those with an input of one of these shapes (the matmuls of one case's models: a process
    that ran other cases before holds their graphs too)."""
    try:
        from torch._inductor.codecache import PyCodeCache
    except ImportError:  # a torch without inductor: nothing compiled
        return []
    found: dict[str, dict] = {}
    for module in list(getattr(PyCodeCache, "modules", [])):
        path = getattr(module, "__file__", None)
        try:
            record = matmuls_in(Path(path).read_text(), module) if path else None
        except OSError:  # the cache directory was cleaned under us: the record is best effort
            continue
        if record is not None and (weight_shapes is None or weight_shapes & set(map(tuple, record["input_shapes"]))):
            found.setdefault(repr(record), record)
    return list(found.values())
