"""``specbench zoo build``: train and package the project's own GSM8K reference models — a BPE
tokenizer, a small Llama target, Medusa-1 heads, calibrated Medusa trees, a draft model and EAGLE-1/2 and
EAGLE-3 heads — with a build record of everything measured. The ``zoo`` command line is specbench/zoo/cli.py.

Output: ``OUT_DIR/gsm8k-tiny/{target,medusa,draft,trees,eagle,eagle3,build_record.json}``, written into a
temporary sibling and renamed into place when complete. Prompts are zero-shot
(``Question: <q>\\nAnswer:``), exactly the prefix of every training document.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specbench.medusa.checkpoint import load_medusa_heads, save_medusa_heads
from specbench.env import environment_fingerprint
from specbench.run.harness import DTYPES
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig
from specbench.medusa.training import head_topk_accuracy, train_medusa_heads
from specbench.medusa.tree_calibration import calibrate_tree, expected_acceptance_length, rank_accuracies, save_tree_json
from specbench.zoo.acceptance import measure_medusa_acceptance
from specbench.zoo.build_record import (
    CUDA_QUALITY_TOLERANCE, MAX_TOTAL_BYTES, PARTS, RECORD_SCHEMA_VERSION, REPRODUCED_METRICS, StageTimer,
    directory_bytes, library_versions, loss_summary, write_record,
)
from specbench.zoo.config import SEED_OFFSETS, ZooBuildConfig
from specbench.zoo.eagle_stage import (
    EAGLE_REPRODUCED_METRICS, EAGLE_SEED_OFFSETS, HEAD_DIRS, EagleStageConfig, StageInputs, eagle_checks, eagle_family,
)
from specbench.zoo.eagle_stage import SCALES as EAGLE_SCALES
from specbench.prompts.gsm8k import read_split
from specbench.zoo.corpus import document_text, partition_records, prompt_ids
from specbench.zoo.lm_training import build_llama, evaluate_lm, load_lm, train_causal_lm
from specbench.zoo.registry import make_readable
from specbench.zoo.self_distillation import collect_continuations, continuation_documents, distillation_prompts
from specbench.zoo.tokenizer import encode_documents, train_tokenizer

TARGET_REF = "specbench-ref/gsm8k-tiny"  # written into the Medusa config as base_model_name_or_path
PROMPT_FORMAT = "zero-shot: 'Question: <question>\\nAnswer:' (specbench.prompts.format_gsm8k_prompt, no exemplars)"
_SEED_OFFSETS = {**SEED_OFFSETS, **EAGLE_SEED_OFFSETS}  # every random stream of the build, the EAGLE stage's last


class BuildExists(FileExistsError, ValueError):
    """OUT_DIR already holds a build; also a ValueError, so CLIs print it as a one-line user error."""


def _save_lm(model, tokenizer, directory: Path, dtype: str) -> None:
    model.to(DTYPES[dtype]).save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)


def _checks(config: ZooBuildConfig, acceptance: dict, total_bytes: int, largest_tree: str) -> dict[str, bool]:
    checks = {}
    if config.min_chain_acceptance is not None:
        rate = acceptance[f"chain_k{config.eval_chain_k}"]["acceptance_rate"]
        checks[f"chain_k{config.eval_chain_k}_acceptance>={config.min_chain_acceptance}"] = rate >= config.min_chain_acceptance
    if config.min_tree_mal is not None:
        mal = acceptance[f"tree_{largest_tree}"]["mean_acceptance_length"]
        checks[f"tree_{largest_tree}_mean_acceptance_length>={config.min_tree_mal}"] = mal >= config.min_tree_mal
    if config.min_chain_acceptance is not None or config.min_tree_mal is not None:  # the full scale
        checks[f"total_bytes<={MAX_TOTAL_BYTES}"] = total_bytes <= MAX_TOTAL_BYTES
    return checks


def _run_pipeline(staging: Path, config: ZooBuildConfig, eagle_config: EagleStageConfig, scale: str, data_dir, device: torch.device,
                  seed: int, progress: bool) -> dict:
    timer = StageTimer()
    seeds = {stage: seed + offset for stage, offset in _SEED_OFFSETS.items()}

    with timer.stage("data"):
        train_split, test_split = read_split(data_dir, "train"), read_split(data_dir, "test")
        records = train_split.records[: config.num_train_records]
        if len(records) <= config.num_heldout or len(test_split.records) < config.eval_num_prompts:
            raise ValueError(
                f"{train_split.path}: {len(records)} train records for {config.num_heldout} held out, and "
                f"{test_split.path}: {len(test_split.records)} test records for {config.eval_num_prompts} evaluation "
                "prompts; use the complete GSM8K files"
            )
        train_records, distill_records, heldout_records = partition_records(records, config.num_heldout, config.num_distill_only_records)

    with timer.stage("tokenizer"):
        tokenizer = train_tokenizer([document_text(r) for r in records[: -config.num_heldout]], config.vocab_size, config.max_context)
        train_docs = encode_documents(tokenizer, [document_text(r) for r in train_records])
        heldout_docs = encode_documents(tokenizer, [document_text(r) for r in heldout_records])

    with timer.stage("target"):
        target = build_llama(config.target, len(tokenizer), config.max_context, tokenizer.eos_token_id, tokenizer.pad_token_id, seeds["target_init"])
        target_losses = train_causal_lm(target, train_docs, config.target_training, seed=seeds["target_data"], device=device, desc="target", progress=progress)
        _save_lm(target, tokenizer, staging / "target", config.weights_dtype)
        target = load_lm(staging / "target", device)
        tokenizer = AutoTokenizer.from_pretrained(staging / "target")
        target_heldout = evaluate_lm(target, heldout_docs, seq_len=config.target_training.seq_len)

    with timer.stage("self_distillation"):
        question_prompts, prefix_prompts = distillation_prompts(
            tokenizer, distill_records, config.num_answer_prefix_prompts, seeds["prefix_cuts"],
            max_length=config.target_training.seq_len - config.distill_max_new_tokens)
        distill_prompts = question_prompts + prefix_prompts
        heldout_prompts = prompt_ids(tokenizer, [r["question"] for r in heldout_records])
        collect = dict(batch_size=config.distill_batch_size, progress=progress)
        hidden, tokens = collect_continuations(target, distill_prompts, config.distill_max_new_tokens, **collect)
        heldout_hidden, heldout_tokens = collect_continuations(target, heldout_prompts, config.distill_max_new_tokens, **collect)

    with timer.stage("medusa"):
        heads_config = MedusaHeadsConfig(config.medusa_num_heads, config.medusa_num_layers, target.config.hidden_size, target.config.vocab_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seeds["heads_init"])
            heads = MedusaHeads(heads_config)
        heads.init_from_lm_head(target.lm_head.weight.detach().cpu())
        head_losses = train_medusa_heads(
            heads, hidden, tokens, steps=config.heads_steps, lr=config.heads_lr, batch_size=config.heads_batch_size,
            seed=seeds["heads_data"], device=device, head_decay=config.heads_decay, progress=progress,
        )
        save_medusa_heads(heads.to(DTYPES[config.weights_dtype]), staging / "medusa", layout="fasterdecoding",
                          base_model_name_or_path=TARGET_REF, weights_format="safetensors")
        heads = load_medusa_heads(staging / "medusa", hidden_size=heads_config.hidden_size, vocab_size=heads_config.vocab_size, dtype=torch.float32).to(device)
        topk = head_topk_accuracy(heads, heldout_hidden, heldout_tokens, config.tree_top_k)  # (heads, k) cumulative

    with timer.stage("trees"):
        per_rank = rank_accuracies(topk)  # (heads, k)
        trees = {}
        for size in config.tree_sizes:
            paths = calibrate_tree(per_rank, size)
            tree_name = f"{config.name}-{size}"
            expected = expected_acceptance_length(paths, per_rank)
            save_tree_json(paths, staging / "trees" / f"{tree_name}.json", metadata={
                "name": tree_name, "num_nodes": len(paths), "expected_mean_acceptance_length": expected,
                "calibrated_for": f"specbench-ref/{config.name}-medusa", "top_k": config.tree_top_k,
                "accuracy_source": f"{len(heldout_prompts)} held-out GSM8K train questions, greedy continuations",
            })
            trees[str(size)] = {"name": tree_name, "paths": paths, "num_nodes": len(paths), "expected_mean_acceptance_length": expected}

    with timer.stage("acceptance"):
        eval_prompts = prompt_ids(tokenizer, [r["question"] for r in test_split.records[: config.eval_num_prompts]])
        settings = {f"chain_k{config.eval_chain_k}": {"num_speculative_tokens": config.eval_chain_k}}
        settings.update({f"tree_{size}": {"tree": tree["paths"]} for size, tree in trees.items()})
        acceptance = measure_medusa_acceptance(target, heads, eval_prompts, settings, max_new_tokens=config.eval_max_new_tokens,
                                               eos_token_id=tokenizer.eos_token_id, progress=progress)

    with timer.stage("draft"):
        draft_docs, _ = continuation_documents(distill_prompts, tokens)
        heldout_continuations, heldout_starts = continuation_documents(heldout_prompts, heldout_tokens)
        draft = build_llama(config.draft, len(tokenizer), config.max_context, tokenizer.eos_token_id, tokenizer.pad_token_id, seeds["draft_init"])
        draft_losses = train_causal_lm(draft, draft_docs, config.draft_training, seed=seeds["draft_data"], device=device, desc="draft", progress=progress)
        _save_lm(draft, tokenizer, staging / "draft", config.weights_dtype)
        draft = load_lm(staging / "draft", device)
        # teacher-forced top-1 agreement with the target's own greedy tokens: what a draft chain needs
        draft_agreement = evaluate_lm(draft, heldout_continuations, seq_len=config.draft_training.seq_len, score_from=heldout_starts)

    with timer.stage("eagle"):
        inputs = StageInputs(target, question_prompts, prefix_prompts, heldout_prompts, eval_prompts,
                             tree=staging / "trees" / f"{config.name}-{eagle_config.tree_size}.json",
                             weights_dtype=config.weights_dtype, max_new_tokens=config.distill_max_new_tokens,
                             eval_max_new_tokens=config.eval_max_new_tokens)
        eagle = eagle_family(staging, inputs, eagle_config, seed=seed, device=device, progress=progress)

    sizes = {part: directory_bytes(staging / part) for part in (*PARTS, *HEAD_DIRS)}
    sizes["total"] = sum(sizes.values())
    largest_tree = str(max(config.tree_sizes))
    checks = {**_checks(config, acceptance, sizes["total"], largest_tree), **eagle_checks(eagle, eagle_config)}
    return {
        "schema": RECORD_SCHEMA_VERSION,
        "name": config.name,
        "status": "complete",
        "scale": scale,
        "seed": seed,
        "device": str(device),
        "data": {
            "train": {"path": str(train_split.path), "sha256": train_split.sha256, "records_used": len(records)},
            "test": {"path": str(test_split.path), "sha256": test_split.sha256, "records_used": config.eval_num_prompts},
            "num_train_documents": len(train_docs),
            "num_heldout_documents": len(heldout_docs),
            "num_distill_only_documents": config.num_distill_only_records,
            "prompt_format": PROMPT_FORMAT,
        },
        "config": config.to_dict(),
        "environment": environment_fingerprint(device=str(device), dtype=config.weights_dtype),
        "libraries": library_versions(),
        "tokenizer": {
            "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "mean_document_tokens": sum(map(len, train_docs)) / len(train_docs),
        },
        "target": {
            "num_parameters": sum(p.numel() for p in target.parameters()),
            **loss_summary(target_losses),
            "heldout_loss": target_heldout["loss"],
            "heldout_top1_accuracy": target_heldout["top1_accuracy"],
        },
        "medusa": {
            "num_distill_sequences": len(distill_prompts),
            "num_heldout_sequences": len(heldout_prompts),
            **loss_summary(head_losses),
            "top1_accuracy": topk[:, 0].tolist(),
            "top5_accuracy": topk[:, min(4, topk.shape[1] - 1)].tolist(),
            "topk_accuracy": topk.tolist(),
        },
        "trees": {size: {k: v for k, v in tree.items() if k != "paths"} for size, tree in trees.items()},
        "acceptance": {
            "prompts": f"first {config.eval_num_prompts} GSM8K test questions, {PROMPT_FORMAT}",
            "max_new_tokens": config.eval_max_new_tokens, "greedy": True, "stop_at_eos": True, "dtype": "float32",
            **acceptance,
        },
        "draft": {
            "num_parameters": sum(p.numel() for p in draft.parameters()),
            "num_train_documents": len(draft_docs),
            **loss_summary(draft_losses),
            "heldout_continuation_loss": draft_agreement["loss"],
            "heldout_top1_agreement_with_target": draft_agreement["top1_accuracy"],
        },
        "eagle": eagle,
        "sizes_bytes": sizes,
        # CPU builds are bit-identical (tests/test_zoo.py); see build_record.REPRODUCED_METRICS
        "reproducibility": {
            "cpu": "bit-identical weights",
            "cuda_quality_tolerance": CUDA_QUALITY_TOLERANCE,
            "metrics": [*REPRODUCED_METRICS, *EAGLE_REPRODUCED_METRICS],
        },
        "checks": checks,
        "passed": all(checks.values()),
        "wall_time_s": timer.total(),
    }


def build_zoo(
    out_dir: str | os.PathLike,
    config: ZooBuildConfig,
    *,
    scale: str = "custom",
    data_dir: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    eagle_config: EagleStageConfig | None = None,
) -> Path:
    """Build the zoo into ``out_dir/<config.name>`` and return that directory. Everything is written
    into a temporary sibling first; a failed build leaves nothing behind. ``eagle_config`` sizes the EAGLE
    stage (default: its full scale for ``scale="full"``, else its test scale)."""
    out_dir = Path(out_dir)
    final = out_dir / config.name
    if final.exists() and not overwrite:
        raise BuildExists(f"{final} already exists; pass --overwrite to replace it or choose another OUT_DIR")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} asked for, but torch {torch.__version__} sees no CUDA GPU; use --device cpu")
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{config.name}.", suffix=".partial", dir=out_dir))
    try:
        eagle_config = eagle_config or EAGLE_SCALES["full" if scale == "full" else "test"]
        write_record(staging, _run_pipeline(staging, config, eagle_config, scale, data_dir, device, seed, progress))
        make_readable(staging)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final
