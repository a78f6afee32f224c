"""GPU speed benchmark on the 7B shape at batch 1: both engines side by side in one run.

Measures, on the weights `specbench zoo synth` wrote, for each engine (static: preallocated cache and one CUDA
graph per step kind over torch.compile-fused pointwise stages; static-unfused: the same graphs over the eager
stages; eager: HFTarget over transformers' dynamic cache): plain decoding tok/s; verification cost T(k)/T(1) for
k = 1..8 and a 63-node tree; speculative decoding at forced full acceptance (an oracle proposing the target's
own greedy continuation: scripted on the host, read each step, and drafted on the device, queued ahead:
bench/device_oracle.py) and at a synthetic per-position acceptance profile. Then transformers `generate` on the
same weights (eager dynamic cache and static cache + torch.compile) as the peer, and the ceiling = copy
bandwidth / weight bytes per token.
Graph capture and warm-up are timed apart and never enter tok/s. Prints a table, writes JSON.

    python bench/speed_7b.py SYNTH_DIR OUT_DIR [--engines static,static-unfused,eager] [--device cuda]
                             [--draft-dir SYNTH_1B_DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _phase_clock import sync  # noqa: E402
from device_oracle import DeviceOracle  # noqa: E402

from specbench.checkpoints.resolve import load_target_model  # noqa: E402
from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402
from specbench.engine.draft import Draft  # noqa: E402
from specbench.engine.hf_target import HFTarget  # noqa: E402
from specbench.engine.static_target import StaticTarget  # noqa: E402
from specbench.engine.step_inputs import slot_input  # noqa: E402
from specbench.env import environment_fingerprint  # noqa: E402
from specbench.proposers.scripted import ScriptedProposer  # noqa: E402

# Medusa-1 on Vicuna-7B: published per-head top-1 accuracy (docs/checkpoints.md), used as a synthetic
# per-position acceptance profile (position i accepted with this probability, given i-1 was)
MEDUSA_PROFILE = (0.56, 0.32, 0.20, 0.15, 0.12)
# bench engine name -> StaticTarget(compile=...)
STATIC_ENGINES = {"static": True, "static-unfused": False}
RATE_KEYS = ("tokens_per_s", "decode_tokens_per_s", "time_to_first_token_s", "mean_acceptance_length")


def copy_bandwidth(device, gib: float = 4.0, reps: int = 10) -> float:
    """Bytes read + written per second by a device-to-device copy."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    return 2 * src.numel() * src.element_size() * reps / (time.perf_counter() - start)


def time_verify(target, prompt: torch.Tensor, draft: Draft, reps: int) -> float:
    """Median seconds of one verification forward of ``[root] + draft`` after ``prompt`` in slot 0 (the first two
    calls warm up: for the static engine they capture the kind's graph)."""
    target.reserve(prompt.numel() + 80, len(draft))  # the draft kind's fixed width: exactly this draft
    target.prefill(0, prompt)
    length = prompt.numel()
    step = [slot_input(int(prompt[-1]), draft, target.device)]  # the root: the prompt's last token
    times = []
    for _ in range(reps + 2):
        sync(target.device)
        start = time.perf_counter()
        target.verify(step)
        sync(target.device)
        times.append(time.perf_counter() - start)
        target.commit([[0]])
        target.truncate({0: length})  # back to the prompt: every rep verifies from the same cache state
    return statistics.median(times[2:])


def decode_rate(target, proposer, prompt, new_tokens) -> dict:
    result = Decoder(target, proposer, GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)).generate(prompt)
    timing = result.timing
    # tokens_per_s counts the prefill (the harness's figure); decode_tokens_per_s the steps after the first
    # token only, the steady state the verify-cost model (K + 1) * T(1) / T(K + 1) describes
    return {"tokens_per_s": timing.tokens_per_s, "decode_tokens_per_s": 1.0 / timing.per_token_latency_s,
            "time_to_first_token_s": timing.time_to_first_token_s,
            "mean_acceptance_length": result.counters.mean_acceptance_length,
            "output": result.output_token_ids, "peak_memory_bytes": timing.peak_memory_bytes}


def hf_generate_rate(model, prompt, new_tokens, **kwargs) -> float:
    """tok/s of ``model.generate`` (prefill included, as in specbench's figures), after one identical warm-up
    run (a static cache is sized by the request, so a shorter warm-up would compile for another shape)."""
    ids = prompt[None].to(model.device)
    attention_mask = torch.ones_like(ids)
    times = []
    for _ in range(2):
        sync(model.device)
        start = time.perf_counter()
        model.generate(ids, attention_mask=attention_mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, **kwargs)
        sync(model.device)
        times.append(time.perf_counter() - start)
    return new_tokens / times[-1]


@torch.inference_mode()
def hf_forward_loop_rate(model, prompt, new_tokens) -> float:
    """tok/s of a bare greedy loop over ``model(...)`` with a DynamicCache: the model's own cost without
    ``generate``'s per-step machinery (logits processors, stopping criteria, input preparation)."""
    from transformers import DynamicCache

    from specbench.engine.hf_target import cache_argument

    cache_kwarg = cache_argument(model.forward)
    ids = prompt[None].to(model.device)
    for _ in range(2):  # the second run is timed
        sync(model.device)
        start = time.perf_counter()
        cache = DynamicCache(config=model.config)
        step = ids
        for _ in range(new_tokens):
            logits = model(input_ids=step, use_cache=True, logits_to_keep=1, **{cache_kwarg: cache}).logits
            step = logits[:, -1:].argmax(-1)  # [1, 1]
        sync(model.device)
        elapsed = time.perf_counter() - start
    return new_tokens / elapsed


def measure_engine(target, prompt, truth, args) -> dict:
    """Plain tok/s, T(k)/T(1) for k = 1..8 and the 63-node tree, oracle and Medusa-profile decoding at K = 3, 5."""
    vocab = target.vocab_size
    # the largest cache any request below needs, allocated once: a cache that grew mid-benchmark would
    # re-capture the static engine's graphs inside a timed request
    target.reserve(prompt.numel() + args.new_tokens + 80, 0)
    decode_rate(target, None, prompt, 8)  # warm-up (and, for the static engine, the plain step's capture)
    plain = decode_rate(target, None, prompt, args.new_tokens)
    decode_rate(target, None, prompt, args.new_tokens)  # a first full-length request pays any remaining cold costs
    plain = decode_rate(target, None, prompt, args.new_tokens)
    figures: dict = {"plain": {key: plain[key] for key in RATE_KEYS}}
    figures["plain"]["matches_eager_greedy"] = plain["output"] == truth[: args.new_tokens]
    kv = getattr(getattr(target, "_cache", None), "kv", None)
    if plain["peak_memory_bytes"] and kv is not None:  # the static engine: weights + its preallocated cache
        weights = sum(p.numel() * p.element_size() for p in target.module.parameters())
        figures["plain"]["peak_memory_bytes"] = plain["peak_memory_bytes"]
        figures["plain"]["peak_over_weights_and_cache"] = plain["peak_memory_bytes"] / (weights + kv.numel() * kv.element_size())

    t1 = time_verify(target, prompt, Draft.chain(torch.empty(0, dtype=torch.long)), args.reps)
    verify_cost = {"1": 1.0}
    for k in range(2, 9):
        draft = Draft.chain(torch.randint(0, vocab, (k - 1,)))
        verify_cost[str(k)] = time_verify(target, prompt, draft, args.reps) / t1
    tree_paths = medusa_tree("mc_sim_7b_63")
    if tree_paths is not None:
        from specbench.engine.tree import TreeBuffers

        tree = tree_paths if isinstance(tree_paths, TreeBuffers) else TreeBuffers.from_paths(tree_paths)
        top = torch.randint(0, vocab, (tree.max_depth, tree.top_k))
        verify_cost["tree63"] = time_verify(target, prompt, tree.draft(top), args.reps) / t1
    figures["verify_seconds_k1"] = t1
    figures["verify_cost_ratio"] = verify_cost

    for k in (3, 5):
        oracle = ScriptedProposer(truth, k, vocab)
        decode_rate(target, oracle, prompt, 8)  # warm-up: the chain width K + 1 is sized and captured here
        full = decode_rate(target, oracle, prompt, args.new_tokens)
        ideal = (k + 1) / verify_cost[str(k + 1)]  # every step emits K + 1 at T(K+1): this many times plain
        oracle_figures = figures[f"spec_full_acceptance_k{k}"] = {key: full[key] for key in RATE_KEYS}
        oracle_figures["fraction_of_ideal"] = full["decode_tokens_per_s"] / (ideal * plain["decode_tokens_per_s"])
        oracle_figures["fraction_of_ideal_with_prefill"] = full["tokens_per_s"] / (ideal * plain["tokens_per_s"])
        queued = decode_rate(target, DeviceOracle(truth, k, target.device), prompt, args.new_tokens)  # queued ahead
        figures[f"spec_full_acceptance_k{k}_device"] = {
            **{key: queued[key] for key in RATE_KEYS},
            "fraction_of_ideal": queued["decode_tokens_per_s"] / (ideal * plain["decode_tokens_per_s"])}
        profiled = decode_rate(target, ScriptedProposer(truth, k, vocab, position_accuracy=MEDUSA_PROFILE), prompt, args.new_tokens)
        figures[f"spec_medusa_profile_k{k}"] = {key: profiled[key] for key in RATE_KEYS}
    return figures


def measure_draft_model(target, prompt, args) -> dict:
    """A draft model's cost per step on this target: the synthetic ~1B Llama (``--draft-dir``, same 32,000
    vocabulary) drafting K=3 on the target's engine, step costs timed as the harness does, and tok/s."""
    from specbench.run.step_costs import measure_step_costs
    from specbench.proposers.draft_model import DraftModelProposer

    proposer = DraftModelProposer.from_options(target, path=str(Path(args.draft_dir) / "target"), num_speculative_tokens=3)
    proposer.reserve(prompt.numel() + args.new_tokens + 80)
    decode_rate(target, proposer, prompt, 8)  # warm-up: the draft's own graphs are captured here
    costs = measure_step_costs(target, proposer, [prompt], reps=args.reps)  # a slot proposer, as Decoder runs it
    rate = decode_rate(target, proposer, prompt, args.new_tokens)
    return {**costs.to_dict(), "tokens_per_s": rate["tokens_per_s"], "mean_acceptance_length": rate["mean_acceptance_length"],
            "draft_capture_seconds": getattr(proposer.draft, "capture_seconds", 0.0)}


def save_partial(out: Path, figures: dict) -> None:
    print(f"-- {time.strftime('%H:%M:%S')} measured so far: {', '.join(sorted(figures))}", flush=True)
    (out / "speed_7b.partial.json").write_text(json.dumps(figures, indent=2, default=str) + "\n")


def medusa_tree(name: str) -> list[list[int]]:
    """A 63-node tree: the published mc_sim_7b_63 when SPECBENCH_DATA_DIR has it, else a greedy 63-node tree."""
    try:
        from specbench.medusa.trees import load_tree

        return load_tree(name)
    except Exception:  # noqa: BLE001 - the benchmark only needs some 63-node tree of depth <= 5
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("synth_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--skip-compile", action="store_true", help="leave out static cache + torch.compile")
    parser.add_argument("--draft-dir", metavar="SYNTH_1B_DIR",
                        help="`specbench zoo synth DIR --shape 1b` output: adds the draft-model row (a ~1B draft's cost "
                        "per step on the static engines, K=3)")
    parser.add_argument("--engines", default="static,static-unfused,eager",
                        help="comma-separated engines to measure: static (one CUDA graph per step kind over "
                        "torch.compile-fused pointwise stages, the engine's default on CUDA), static-unfused (the "
                        "same graphs over the eager stages), eager (HFTarget)")
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(STATIC_ENGINES) - {"eager"}:
        parser.error(f"--engines {args.engines!r}: expected a comma-separated list of static, static-unfused, eager")

    device = torch.device(args.device)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = load_target_model(str(Path(args.synth_dir) / "target"), dtype=torch.bfloat16, device=str(device))
    target = HFTarget(model)
    vocab = target.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(0))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    figures: dict = {"env": environment_fingerprint(device=str(device), dtype="bfloat16"), "weight_bytes": weight_bytes}

    bandwidth = copy_bandwidth(device) if device.type == "cuda" else float("nan")
    ceiling = bandwidth / weight_bytes
    figures["copy_bandwidth_bytes_per_s"] = bandwidth
    figures["ceiling_tokens_per_s"] = ceiling

    truth = decode_rate(target, None, prompt, args.new_tokens + 16)["output"]  # the oracle's script (eager, exact)
    # the same oracle chain with cuDNN attention allowed, as before HFTarget switched it off: a prompt of
    # another length, so every (query, key) length pair is new to cuDNN's plan cache, as in real traffic
    from specbench.engine import hf_target

    default_backends = hf_target.VARIABLE_SHAPE_SDPA_BACKENDS
    hf_target.VARIABLE_SHAPE_SDPA_BACKENDS = [torch.nn.attention.SDPBackend.CUDNN_ATTENTION, *default_backends]
    try:
        other_prompt = torch.randint(0, vocab, (args.prompt_len + 7,), generator=torch.Generator().manual_seed(1))
        other_truth = decode_rate(target, None, other_prompt, args.new_tokens + 16)["output"]
        cudnn = decode_rate(target, ScriptedProposer(other_truth, 3, vocab), other_prompt, args.new_tokens)
        figures["spec_full_acceptance_k3_cudnn_attention"] = {k: cudnn[k] for k in ("tokens_per_s", "mean_acceptance_length")}
    finally:
        hf_target.VARIABLE_SHAPE_SDPA_BACKENDS = default_backends

    figures["hf_forward_loop"] = {"tokens_per_s": hf_forward_loop_rate(model, prompt, args.new_tokens)}
    figures["hf_generate_eager"] = {"tokens_per_s": hf_generate_rate(model, prompt, args.new_tokens)}
    if not args.skip_compile and device.type == "cuda":
        try:  # a static cache makes generate compile the decoding forward itself (CUDA graphs included)
            figures["hf_generate_static_compile"] = {
                "tokens_per_s": hf_generate_rate(model, prompt, args.new_tokens, cache_implementation="static")}
        except Exception as err:  # noqa: BLE001 - the peer failing to compile must not cost the other figures
            figures["hf_generate_static_compile_error"] = f"{type(err).__name__}: {err}"[:2000]
            print(f"static cache + compile failed, left out of the table: {figures['hf_generate_static_compile_error']}")

    # the static engines last, each loading its own weights after the transformers model is freed, so that
    # their peak memory is theirs alone (weights + preallocated cache + activations)
    synth_target = str(Path(args.synth_dir) / "target")
    if "eager" in engines:
        save_partial(out, figures)
        figures["eager"] = measure_engine(target, prompt, truth, args)
    del target, model
    import gc

    torch._dynamo.reset()  # the compiled peer's graphs hold the transformers model's weights
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for engine in [e for e in engines if e != "eager"]:
        save_partial(out, figures)  # a call cut short by the device's time limit still leaves what it measured
        try:
            engine_target = StaticTarget.from_pretrained(synth_target, dtype=torch.bfloat16, device=device,
                                                         compile=STATIC_ENGINES[engine])
            figures[engine] = measure_engine(engine_target, prompt, truth, args)
            if args.draft_dir:
                figures[engine]["draft_model_k3"] = measure_draft_model(engine_target, prompt, args)
            figures[engine]["capture_seconds"] = engine_target.capture_seconds
        except Exception as err:  # noqa: BLE001 - one engine failing (e.g. a compile error) must not cost the others
            figures[f"{engine}_error"] = f"{type(err).__name__}: {err}"[:2000]
            print(f"{engine} failed, left out of the table: {figures[f'{engine}_error']}")
        engine_target = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    engines = [engine for engine in engines if engine in figures]
    best_static = max((figures[e]["plain"]["tokens_per_s"] for e in engines if e != "eager"), default=None)
    figures["static_plain_tokens_per_s"] = best_static

    peer = figures["hf_generate_eager"]["tokens_per_s"]
    compiled = figures.get("hf_generate_static_compile", {}).get("tokens_per_s")
    figures["hf_static_compile_tokens_per_s"] = compiled
    rows = [("ceiling (copy bandwidth / weight bytes)", ceiling)]
    rows.append(("transformers generate, eager", peer))
    rows.append(("transformers forward loop, eager (no generate)", figures["hf_forward_loop"]["tokens_per_s"]))
    if compiled is not None:
        rows.append(("transformers generate, static cache + compile", compiled))
    for engine in engines:
        measured = figures[engine]
        rows.append((f"specbench {engine}: plain decoding", measured["plain"]["tokens_per_s"]))
        for k in (3, 5):
            full, profiled = measured[f"spec_full_acceptance_k{k}"], measured[f"spec_medusa_profile_k{k}"]
            rows.append((f"specbench {engine}: full acceptance, K={k} (MAL {full['mean_acceptance_length']:.2f}, "
                         f"{full['fraction_of_ideal']:.2f} of ideal, {full['fraction_of_ideal_with_prefill']:.2f} with prefill)",
                         full["tokens_per_s"]))
            queued = measured[f"spec_full_acceptance_k{k}_device"]
            rows.append((f"specbench {engine}: full acceptance, K={k}, device oracle (MAL "
                         f"{queued['mean_acceptance_length']:.2f}, {queued['fraction_of_ideal']:.2f} of ideal)",
                         queued["tokens_per_s"]))
            rows.append((f"specbench {engine}: Medusa-7B profile, K={k} (MAL {profiled['mean_acceptance_length']:.2f})",
                         profiled["tokens_per_s"]))
    if "spec_full_acceptance_k3_cudnn_attention" in figures:
        rows.append(("specbench eager: full acceptance, K=3, cuDNN attention allowed (cold shapes)",
                     figures["spec_full_acceptance_k3_cudnn_attention"]["tokens_per_s"]))
    lines = [f"{'what':96} {'tok/s':>8} {'/ceiling':>9} {'/HF eager':>10} {'/HF compile':>12}"]
    for label, rate in rows:
        versus_compiled = f"{rate / compiled:12.2f}" if compiled else f"{'n/a':>12}"
        lines.append(f"{label:96} {rate:8.1f} {rate / ceiling:9.2f} {rate / peer:10.2f} {versus_compiled}")
    for engine in engines:
        plain_figures = figures[engine]["plain"]
        lines.append(f"{engine}: plain decode phase {plain_figures['decode_tokens_per_s']:.1f} tok/s after a "
                     f"{plain_figures['time_to_first_token_s'] * 1e3:.1f} ms prefill of {args.prompt_len} tokens")
    for engine in engines:
        cost = figures[engine]["verify_cost_ratio"]
        lines.append(f"{engine}: T(1) = {figures[engine]['verify_seconds_k1'] * 1e3:.2f} ms; T(k)/T(1): "
                     + ", ".join(f"{k}: {v:.2f}" for k, v in cost.items()))
    for engine in engines:
        if engine != "eager":
            lines.append(f"{engine}: warm-up + compile + capture {figures[engine]['capture_seconds']:.1f} s (not in any tok/s)")
        draft = figures[engine].get("draft_model_k3")
        if draft:
            lines.append(f"{engine}: draft model (synthetic 1B) K=3: one propose {draft['draft_s'] * 1e3:.2f} ms = "
                         f"{draft['draft_cost_ratio']:.2f} target steps (T(1) {draft['t1_s'] * 1e3:.2f} ms), "
                         f"T(4)/T(1) {draft['verify_cost_ratio']:.2f}, {draft['tokens_per_s']:.1f} tok/s at MAL "
                         f"{draft['mean_acceptance_length']:.2f}")
    table = "\n".join(lines)
    figures["table"] = table
    (out / "speed_7b.json").write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
