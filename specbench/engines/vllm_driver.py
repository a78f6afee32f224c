"""The process that runs one case on vLLM's offline ``LLM``: ``python vllm_driver.py JOB OUT``.

It reads the job (JSON: target, prompts as token ids, sampling, speculative_config) and writes, atomically, the
outputs, vLLM's per-request counters (``spec_decode_metrics``, level "detailed") and, per request, the difference
of its aggregate counters (``LLM.get_metrics()``, which accumulate across generate calls), or ``{"refused": ...}``
for a shape vLLM's CPU attention does not take. vLLM spawns its engine core, hence the ``__main__`` guard: this
module imports vllm only when run as a program, and nothing of specbench, so the python of any environment
with vLLM runs it (docs/conformance.md).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

COUNTERS = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def aggregate_counters(llm) -> dict:
    """vLLM's run-level speculative counters now (they accumulate over the LLM's life)."""
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_position": []}
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            out[COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = [int(v) for v in metric.values]
            have = out["accepted_per_position"]
            out["accepted_per_position"] = [a + b for a, b in zip(values, have + [0] * (len(values) - len(have)))]
    return out


def difference(after: dict, before: dict) -> dict:
    out = {key: after[key] - before[key] for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    earlier = before["accepted_per_position"] + [0] * len(after["accepted_per_position"])
    out["accepted_per_position"] = [a - b for a, b in zip(after["accepted_per_position"], earlier)]
    return out


def request_counters(metrics) -> dict:
    """specbench's per-request counters from vLLM's RequestSpecDecodeMetrics (its per-step accepted counts give
    the per-position ones: a step that accepted a drafts accepted positions 0..a-1)."""
    data = metrics.to_dict()
    per_position = [0] * int(data["num_spec_tokens"])
    for accepted in data.get("per_step_accepted", []):
        for position in range(accepted):
            per_position[position] += 1
    return {"num_drafts": data["num_spec_steps"], "num_draft_tokens": data["num_draft_tokens"],
            "num_accepted_tokens": data["num_accepted_draft_tokens"], "accepted_per_position": per_position,
            "vllm_spec_decode_metrics": data}


def unsupported_shapes(job: dict) -> str | None:
    """Why vLLM's CPU attention would refuse the job's target or draft (its head size), or None."""
    if job["device"] != "cpu":
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    models = [("target", job["target"])]
    spec = job.get("speculative_config") or {}
    if spec.get("model") and spec.get("method") in ("draft_model", "eagle", "eagle3"):
        models.append((spec["method"], spec["model"]))
    for role, directory in models:
        config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
        heads = config.get("num_attention_heads")
        head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads else None)
        if head_dim is not None and head_dim not in supported:
            return (f"vLLM's CPU attention does not take head_dim={head_dim} (the {role} {directory}: hidden_size "
                    f"{config.get('hidden_size')} / {heads} heads); it takes head sizes {supported}")
    return None


def run(job: dict, kind: str) -> dict:
    """One engine (plain, or with the job's speculative_config) decoding every prompt alone, in order."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec_config = job["speculative_config"] if kind == "spec" else None
    llm = LLM(model=job["target"], dtype=job["dtype"], max_model_len=job["max_model_len"], seed=job["seed"],
              enforce_eager=job["enforce_eager"], speculative_config=spec_config,
              disable_log_stats=kind != "spec", per_request_spec_decode_metrics="detailed" if spec_config else "none")
    sampling = SamplingParams(temperature=job["temperature"], top_p=job["top_p"], max_tokens=job["max_tokens"],
                              ignore_eos=job["ignore_eos"], seed=None if job["temperature"] == 0 else job["seed"])
    requests = []
    for ids in job["prompts"]:
        before = aggregate_counters(llm) if spec_config else None
        started = time.perf_counter()
        (output,) = llm.generate([TokensPrompt(prompt_token_ids=ids)], sampling, use_tqdm=False)
        seconds = time.perf_counter() - started
        completion = output.outputs[0]
        record = {"output_token_ids": list(completion.token_ids), "finish_reason": completion.finish_reason,
                  "seconds": seconds}
        if spec_config:
            metrics = completion.spec_decode_metrics
            record.update(request_counters(metrics) if metrics is not None else
                          {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_position": []})
            record["aggregate"] = difference(aggregate_counters(llm), before)
        requests.append(record)
    config = {"model": job["target"], "dtype": str(llm.llm_engine.model_config.dtype),
              "max_model_len": llm.llm_engine.model_config.max_model_len, "enforce_eager": job["enforce_eager"],
              "speculative_config": repr(llm.llm_engine.vllm_config.speculative_config)}
    del llm
    gc.collect()
    return {"requests": requests, "config": config}


def main(job_file: str, out_file: str) -> int:
    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default takes a share of the memory
    import vllm

    result: dict = {"version": vllm.__version__}
    refusal = unsupported_shapes(job)
    if refusal:
        result["refused"] = refusal
    else:
        for kind in job["runs"]:
            result[kind] = run(job, kind)
    staging = Path(out_file).with_suffix(".partial")
    staging.write_text(json.dumps(result), encoding="utf-8")
    os.replace(staging, out_file)
    return 0


if __name__ == "__main__":
    # run by its path, this file's folder leads sys.path: its siblings (interface.py, ...) must not shadow modules
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.exit(main(*sys.argv[1:]))
