"""How fast can a 7B decode step read its weights? The step's matmuls alone, per backend, in one CUDA graph.

For the Vicuna-7B shape at verify width W (1 = plain decoding), replays 32 layers x (qkv, o, gate_up,
down) + lm_head over distinct bf16 weights (13 GB, nothing stays in L2) as one CUDA graph, through
cuBLAS (``F.linear``) and through ``torch.compile`` max-autotune (at one row a multiply-and-sum reduction tuned by
coordinate descent, what the static engine runs; wider, Triton mm templates competing with cuBLAS per shape), the same
with a wider coordinate descent (radius 2, every direction checked: whether the engine's tuning stops short of a
better reduction), and at one row through bench/_gemv.py's Triton GEMV (autotuned per shape; its largest difference
from cuBLAS's output is printed). Prints ms per step and the fraction of the copy-bandwidth ceiling (weight bytes /
bandwidth), and writes gemv_backends.json.

    python bench/gemv_backends.py OUT_DIR [--widths 1,4] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._phase_clock import graph_replay_seconds  # noqa: E402
from bench.speed_7b import copy_bandwidth  # noqa: E402

HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 4096, 11008, 32, 32000
LAYER_SHAPES = {"qkv": (3 * HIDDEN, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * INTERMEDIATE, HIDDEN),
                "down": (HIDDEN, INTERMEDIATE)}


def step_fn(linear):
    def step(inputs: dict, weights: list[dict], head: torch.Tensor) -> torch.Tensor:
        out = None
        for layer in weights:
            for name, w in layer.items():
                out = linear(inputs[name], w)  # (W, out)
        return linear(inputs["o"], head), out  # (W, V)
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--widths", default="1,4")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    weights = [{name: torch.randn(shape, device=dev, dtype=dtype) * 0.02 for name, shape in LAYER_SHAPES.items()}
               for _ in range(LAYERS)]
    head = torch.randn(VOCAB, HIDDEN, device=dev, dtype=dtype) * 0.02
    weight_bytes = sum(w.numel() * 2 for layer in weights for w in layer.values()) + head.numel() * 2
    bandwidth = copy_bandwidth(dev)
    ideal = weight_bytes / bandwidth
    backends = {
        "cublas": F.linear,
        "compile-max-autotune": torch.compile(lambda x, w: F.linear(x, w), mode="max-autotune-no-cudagraphs",
                                              dynamic=False),
        # max-autotune-no-cudagraphs' settings with a wider search (mode and options cannot be given together)
        "compile-max-autotune-wide": torch.compile(lambda x, w: F.linear(x, w), dynamic=False, options={
            "max_autotune": True, "coordinate_descent_tuning": True, "coordinate_descent_search_radius": 2,
            "coordinate_descent_check_all_directions": True, "triton.cudagraphs": False}),
    }
    from bench._gemv import gemv
    torch._dynamo.config.recompile_limit = 64
    figures = {"weight_bytes": weight_bytes, "copy_bandwidth_bytes_per_s": bandwidth, "ideal_s": ideal, "rows": []}
    for width in [int(w) for w in args.widths.split(",")]:
        inputs = {name: torch.randn(width, shape[1], device=dev, dtype=dtype) for name, shape in LAYER_SHAPES.items()}
        if width == 1:
            x, w = inputs["down"], weights[0]["down"]
            print(f"triton-gemv max |difference| from cuBLAS: {(gemv(x, w) - F.linear(x, w)).abs().max().item():.3g} "
                  f"(outputs of size {F.linear(x, w).abs().mean().item():.3g})", flush=True)
        for name, linear in {**backends, **({"triton-gemv": gemv} if width == 1 else {})}.items():
            start = time.perf_counter()
            seconds = graph_replay_seconds(lambda: step_fn(linear)(inputs, weights, head), args.reps)
            row = {"backend": name, "width": width, "step_s": seconds, "fraction_of_ceiling": ideal / seconds,
                   "warmup_and_compile_s": time.perf_counter() - start - seconds * (args.reps + 2)}
            figures["rows"].append(row)
            print(f"W={width:3d} {name:22s} {seconds * 1e3:6.2f} ms  {ideal / seconds:5.2f} of ceiling "
                  f"(ideal {ideal * 1e3:.2f} ms; warm-up + compile {row['warmup_and_compile_s']:.0f} s)", flush=True)
    (out / "gemv_backends.json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
