"""The zoo's EAGLE stage: self-distilled EAGLE-1/2 and EAGLE-3 heads for a build, shipped and measured (docs/zoo.md#eagle-heads)."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specbench.eagle.checkpoint import load_eagle_head, save_eagle_head
from specbench.eagle.checkpoint3 import load_eagle3_head, save_eagle3_head
from specbench.eagle.draft_head import EagleConfig, EagleHead
from specbench.eagle.eagle3 import Eagle3Config, eagle3_aux_layers
from specbench.eagle.training import EagleTrainSettings, eagle_loss, evaluate, train_eagle_head
from specbench.eagle.training_data import FeatureSet, generate_features
from specbench.eagle.training3 import (
    eagle3_loss, new_eagle3_head, select_draft_vocab, token_counts, train_eagle3_head, vocab_coverage,
)
from specbench.env import environment_fingerprint
from specbench.run.harness import DTYPES
from specbench.zoo.build_record import (MAX_TOTAL_BYTES, PARTS, REPRODUCED_METRICS, StageTimer, directory_bytes,
                                        loss_summary, part_digests)
from specbench.zoo.config import SEED_OFFSETS
from specbench.zoo.corpus import partition_records, prompt_ids
from specbench.zoo.eagle_acceptance import measure_acceptance
from specbench.zoo.lm_training import load_lm
from specbench.zoo.self_distillation import distillation_prompts

# offsets from the build seed (they continue zoo/config.py's SEED_OFFSETS)
EAGLE_SEED_OFFSETS = {"eagle_data": 7, "eagle_init": 8, "eagle3_init": 9}
HEAD_DIRS = ("eagle", "eagle3")


@dataclass(frozen=True)
class EagleStageConfig:
    # distillation data: seeded subsets of the build's self-distillation prompts, each continued greedily by the
    # target for the build's distill_max_new_tokens; question prompts are exactly the evaluation's prompt form
    num_question_prompts: int
    num_answer_prefix_prompts: int
    num_heldout_prompts: int  # of the build's held-out questions: the heads' held-out agreement
    generation_batch_size: int
    eagle: EagleTrainSettings  # EAGLE-1/2: feature regression + 0.1 cross-entropy (the paper's recipe)
    eagle3: EagleTrainSettings  # EAGLE-3: cross-entropy with training-time test (unroll > 1)
    draft_vocab_size: int  # EAGLE-3's: the most frequent target tokens of the distillation data
    eagle3_intermediate_size: int | None = None  # EAGLE-3's MLP width (None: the target's, as EAGLE-1/2's)
    chain_k: int = 3
    tree_size: int = 63  # EAGLE-1's static tree: the build's trees/<name>-<size>.json
    dynamic: dict = field(default_factory=lambda: {"top_k": 8, "depth": 6, "total_tokens": 60})  # EAGLE-2 and EAGLE-3
    min_eagle2_mal: float | None = None  # the checks; None: not checked at this scale
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


FULL = EagleStageConfig(
    num_question_prompts=3000, num_answer_prefix_prompts=0, num_heldout_prompts=64, generation_batch_size=64,
    eagle=EagleTrainSettings(steps=1000, batch_size=16, lr=3e-3, warmup_steps=100, noise=0.2),
    # 6 unroll steps, the dynamic tree's depth, on a random 40% of the positions: held-out top-1 stays 0.80-0.81
    # at every depth (with 3 steps the dynamic tree's depth-6 acceptance was 0.375, with 6 0.465; 20 prompts)
    eagle3=EagleTrainSettings(steps=1000, batch_size=16, lr=3e-3, warmup_steps=100, noise=0.2, unroll=6,
                              unroll_fraction=0.4),
    # the 1,536 most frequent of 1,619 distinct next tokens: 99.96% of the distillation tokens (1,024: 98.1%, a 2%
    # miss at every depth; with it EAGLE-3's dynamic tree stayed below EAGLE-2's, 5.28 vs 5.42 on 20 prompts)
    draft_vocab_size=1536, min_eagle2_mal=3.5,
)
TEST = EagleStageConfig(
    num_question_prompts=6, num_answer_prefix_prompts=2, num_heldout_prompts=2, generation_batch_size=8,
    eagle=EagleTrainSettings(steps=4, batch_size=4, lr=1e-3, warmup_steps=1),
    eagle3=EagleTrainSettings(steps=4, batch_size=4, lr=1e-3, warmup_steps=1, noise=0.0, unroll=2),
    draft_vocab_size=128, dynamic={"top_k": 3, "depth": 3, "total_tokens": 8},
)
SCALES = {"full": FULL, "test": TEST}


@dataclass
class StageInputs:
    """What the stage reads from its build: the target, and token ids of the build's prompts."""

    model: torch.nn.Module  # the shipped target, in fp32 on the stage's device
    question_prompts: list[list[int]]
    answer_prefix_prompts: list[list[int]]
    heldout_prompts: list[list[int]]
    eval_prompts: list[list[int]]
    tree: Path  # the static tree EAGLE-1 drafts
    weights_dtype: str
    max_new_tokens: int  # of the distillation continuations
    eval_max_new_tokens: int


# ---------------------------------------------------------------- data


def seeded_subset(items: list, count: int, generator: torch.Generator) -> list:
    """``count`` items drawn without replacement in a seeded order (all of them when fewer)."""
    return [items[i] for i in torch.randperm(len(items), generator=generator)[:count].tolist()]


def distillation_features(inputs: StageInputs, prompts: list[list[int]], config: EagleStageConfig, progress: bool) -> FeatureSet:
    """The target's greedy continuations of ``prompts`` with its final and EAGLE-3 aux features at every position."""
    aux = eagle3_aux_layers(inputs.model.config.num_hidden_layers)
    return generate_features(inputs.model, prompts, inputs.max_new_tokens, aux_layers=aux,
                             batch_size=config.generation_batch_size, progress=progress)


def training_prompts(inputs: StageInputs, config: EagleStageConfig, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return (seeded_subset(inputs.question_prompts, config.num_question_prompts, generator)
            + seeded_subset(inputs.answer_prefix_prompts, config.num_answer_prefix_prompts, generator))


# ---------------------------------------------------------------- heads


def head_config(model) -> EagleConfig:
    """An EAGLE-1/2 head shaped like one of the target's layers (the published drafts' convention)."""
    c = model.config
    return EagleConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_attention_heads=c.num_attention_heads,
                       num_key_value_heads=c.num_key_value_heads, vocab_size=c.vocab_size, rms_norm_eps=c.rms_norm_eps,
                       rope_theta=float((getattr(c, "rope_parameters", None) or {}).get("rope_theta")
                                        or getattr(c, "rope_theta", None) or 10000.0),
                       max_position_embeddings=c.max_position_embeddings)


def _summary(history: list[dict], heldout: dict, head: torch.nn.Module, settings: EagleTrainSettings) -> dict:
    return {
        "num_parameters": sum(p.numel() for p in head.parameters()),
        "settings": asdict(settings),
        **loss_summary([h["total"] for h in history]),
        "final_train_top1_per_depth": history[-1]["top1"],
        "heldout_loss_per_depth": heldout["loss"],
        "heldout_top1_per_depth": heldout["top1"],
    }


def train_eagle_dir(out: Path, inputs: StageInputs, train: FeatureSet, heldout: FeatureSet, config: EagleStageConfig,
                    seed: int, device, progress: bool) -> dict:
    """Train the EAGLE-1/2 head (``seed``: its init, batch order and noise) and write it to ``out`` (no
    embed_tokens: the target's serves)."""
    model = inputs.model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(head_config(model), with_embed=False)
    embedding, lm_head, settings = model.get_input_embeddings(), model.lm_head, dataclasses.replace(config.eagle, seed=seed)
    history = train_eagle_head(head, train, embedding, lm_head, settings, device=device, progress=progress)
    measured = evaluate(lambda b, g: eagle_loss(head, embedding, lm_head, b, _eval(settings), g), heldout,
                        batch_size=settings.batch_size, device=device)
    save_eagle_head(out, head.to(DTYPES[inputs.weights_dtype]), format="safetensors", with_embed=False)
    return {"layout": "EAGLE-1/2 (SafeAILab cnets1), no embed_tokens", **_summary(history, measured, head, settings)}


def train_eagle3_dir(out: Path, inputs: StageInputs, train: FeatureSet, heldout: FeatureSet, config: EagleStageConfig,
                     seed: int, device, progress: bool) -> dict:
    """Train the EAGLE-3 head over the draft vocabulary of ``train``'s most frequent tokens; write it to ``out``."""
    model = inputs.model
    counts = token_counts(train, model.config.vocab_size)
    d2t, t2d = select_draft_vocab(counts, config.draft_vocab_size)
    shape = head_config(model)
    shape = dataclasses.replace(shape, intermediate_size=config.eagle3_intermediate_size or shape.intermediate_size)
    head = new_eagle3_head(Eagle3Config.from_eagle(shape, config.draft_vocab_size), d2t, t2d,
                           target_lm_head=model.lm_head.weight.detach().cpu(),
                           target_norm=model.get_decoder().norm.weight.detach().cpu(), seed=seed)
    embedding, lm_head, settings = model.get_input_embeddings(), model.lm_head, dataclasses.replace(config.eagle3, seed=seed)
    history = train_eagle3_head(head, train, embedding, lm_head, settings, device=device, progress=progress)
    measured = evaluate(lambda b, g: eagle3_loss(head, embedding, lm_head, b, _eval(settings), g), heldout,
                        batch_size=settings.batch_size, device=device)
    save_eagle3_head(out, head.to(DTYPES[inputs.weights_dtype]), format="safetensors")
    return {"layout": "EAGLE-3 (SafeAILab cnets), d2t/t2d", "draft_vocab_size": config.draft_vocab_size,
            "aux_layers": list(eagle3_aux_layers(model.config.num_hidden_layers)),
            "draft_vocab_coverage": vocab_coverage(counts, t2d), **_summary(history, measured, head, settings)}


def _eval(settings: EagleTrainSettings) -> EagleTrainSettings:
    """Held-out measurement: no noise, at least the depths of a K=3 chain."""
    return dataclasses.replace(settings, noise=0.0, unroll=max(settings.unroll, 3))


def read_back(directory: Path, model) -> None:
    """The shipped heads through the strict loaders (refusing anything off-layout)."""
    sizes = dict(target_hidden_size=model.config.hidden_size, target_vocab_size=model.config.vocab_size)
    load_eagle_head(directory / "eagle", **sizes, dtype=torch.float32)
    load_eagle3_head(directory / "eagle3", **sizes, dtype=torch.float32)


# ---------------------------------------------------------------- acceptance


def acceptance_settings(config: EagleStageConfig, tree: Path) -> dict[str, tuple[str, str, dict]]:
    """name -> (proposer, head directory, options): the five ways the family drafts."""
    chain, dynamic = {"num_speculative_tokens": config.chain_k}, dict(config.dynamic)
    return {
        f"eagle_chain_k{config.chain_k}": ("eagle", "eagle", chain),
        f"eagle1_tree_{config.tree_size}": ("eagle", "eagle", {"tree": str(tree)}),
        "eagle2_dynamic": ("eagle", "eagle", dynamic),
        f"eagle3_chain_k{config.chain_k}": ("eagle3", "eagle3", chain),
        "eagle3_dynamic": ("eagle3", "eagle3", dynamic),
    }


# ---------------------------------------------------------------- the stage


def eagle_family(directory: Path, inputs: StageInputs, config: EagleStageConfig, *, seed: int, device,
                 progress: bool = True) -> dict:
    """Train both heads, write ``directory/eagle`` and ``directory/eagle3``, read them back strictly, measure
    acceptance; returns the build record's ``eagle`` section."""
    timer, seeds = StageTimer(), {name: seed + offset for name, offset in EAGLE_SEED_OFFSETS.items()}
    with timer.stage("self_distillation"):
        train = distillation_features(inputs, training_prompts(inputs, config, seeds["eagle_data"]), config, progress)
        heldout = distillation_features(inputs, inputs.heldout_prompts[: config.num_heldout_prompts], config, progress)
    with timer.stage("eagle"):
        eagle = train_eagle_dir(directory / "eagle", inputs, train, heldout, config, seeds["eagle_init"], device, progress)
    with timer.stage("eagle3"):
        eagle3 = train_eagle3_dir(directory / "eagle3", inputs, train, heldout, config, seeds["eagle3_init"], device, progress)
    read_back(directory, inputs.model)
    with timer.stage("acceptance"):
        acceptance = measure_acceptance(directory, inputs.model, inputs.eval_prompts, inputs.eval_max_new_tokens,
                                        acceptance_settings(config, inputs.tree), progress)
    return {
        "config": config.to_dict(),
        "device": str(device),
        "environment": environment_fingerprint(device=str(device), dtype="float32"),
        "data": {"num_sequences": len(train), "num_heldout_sequences": len(heldout),
                 "num_trained_positions": sum(len(t) - 1 - s for t, s in zip(train.token_ids, train.starts)),
                 "max_new_tokens": inputs.max_new_tokens, "seed": seeds["eagle_data"]},
        "eagle": eagle,
        "eagle3": eagle3,
        "acceptance": {"prompts": f"the build's {len(inputs.eval_prompts)} evaluation prompts (GSM8K test, zero-shot)",
                       "max_new_tokens": inputs.eval_max_new_tokens, "greedy": True, "stop_at_eos": True,
                       "dtype": "float32", "dynamic_tree": dict(config.dynamic), **acceptance},
        "sizes_bytes": {name: directory_bytes(directory / name) for name in HEAD_DIRS},
        "wall_time_s": timer.total(),
    }


def eagle_checks(section: dict, config: EagleStageConfig) -> dict[str, bool]:
    """EAGLE-2's MAL reaches its floor and EAGLE-3's reaches EAGLE-2's (full scale only)."""
    if config.min_eagle2_mal is None:
        return {}
    acc = section["acceptance"]
    eagle2, eagle3 = acc["eagle2_dynamic"]["mean_acceptance_length"], acc["eagle3_dynamic"]["mean_acceptance_length"]
    lossless = all(v["outputs_match_plain"] for v in acc.values() if isinstance(v, dict) and "outputs_match_plain" in v)
    return {f"eagle2_mal>={config.min_eagle2_mal}": eagle2 >= config.min_eagle2_mal, "eagle3_mal>=eagle2_mal": eagle3 >= eagle2,
            "eagle_outputs_match_plain": lossless}


# what a rebuild must reproduce (appended to the record's reproducibility.metrics)
EAGLE_REPRODUCED_METRICS = ("eagle.acceptance.eagle2_dynamic.mean_acceptance_length",
                            "eagle.acceptance.eagle3_dynamic.mean_acceptance_length")


class EagleHeadsExist(FileExistsError, ValueError):
    """The build already has EAGLE heads; also a ValueError, so CLIs print it as a one-line user error."""


def with_eagle(record: dict, section: dict, config: EagleStageConfig, build: Path, max_total_bytes: int) -> dict:
    """The build record with its ``eagle`` section, sizes, checks and reproducibility metrics brought up to date."""
    new = {**record, "eagle": section}
    sizes = {part: directory_bytes(build / part) for part in PARTS} | section["sizes_bytes"]
    new["sizes_bytes"] = {**sizes, "total": sum(sizes.values())}
    checks = {k: v for k, v in record["checks"].items() if not k.startswith(("total_bytes<=", "eagle"))}
    if len(checks) != len(record["checks"]) or config.min_eagle2_mal is not None:  # a full-scale build
        checks[f"total_bytes<={max_total_bytes}"] = new["sizes_bytes"]["total"] <= max_total_bytes
    new["checks"] = {**checks, **eagle_checks(section, config)}
    new["passed"] = all(new["checks"].values())
    rules = dict(record.get("reproducibility") or {})  # records that predate it: compare_records' defaults
    earlier = [m for m in rules.get("metrics", REPRODUCED_METRICS) if not m.startswith("eagle.")]
    rules["metrics"] = earlier + list(EAGLE_REPRODUCED_METRICS)
    new["reproducibility"] = rules
    new["wall_time_s"] = {**record["wall_time_s"], "eagle": section["wall_time_s"]["total"]}
    return new


def stage_inputs_for_build(build: Path, record: dict, config: EagleStageConfig, data_dir, device) -> StageInputs:
    """The build's target (fp32) and its prompts, regenerated from its record exactly as the build formed them."""
    from specbench.prompts.gsm8k import read_split
    from transformers import AutoTokenizer

    cfg, seed = record["config"], record["seed"]
    train_split, test_split = read_split(data_dir, "train"), read_split(data_dir, "test")
    for split, used in ((train_split, record["data"]["train"]), (test_split, record["data"]["test"])):
        if split.sha256 != used["sha256"]:
            raise ValueError(f"{split.path}: sha256 {split.sha256[:12]}… but {build} was built from {used['sha256'][:12]}… "
                             f"({used['path']}); point --data-dir at the GSM8K files the build used")
    records = train_split.records[: cfg["num_train_records"]]
    _, distill, heldout = partition_records(records, cfg["num_heldout"], cfg["num_distill_only_records"])
    tokenizer = AutoTokenizer.from_pretrained(build / "target")
    questions, prefixes = distillation_prompts(tokenizer, distill, cfg["num_answer_prefix_prompts"], seed + SEED_OFFSETS["prefix_cuts"],
                                               max_length=cfg["target_training"]["seq_len"] - cfg["distill_max_new_tokens"])
    return StageInputs(
        model=load_lm(build / "target", torch.device(device)), question_prompts=questions, answer_prefix_prompts=prefixes,
        heldout_prompts=prompt_ids(tokenizer, [r["question"] for r in heldout]),
        eval_prompts=prompt_ids(tokenizer, [r["question"] for r in test_split.records[: cfg["eval_num_prompts"]]]),
        tree=build / "trees" / f"{record['name']}-{config.tree_size}.json", weights_dtype=cfg["weights_dtype"],
        max_new_tokens=cfg["distill_max_new_tokens"], eval_max_new_tokens=cfg["eval_max_new_tokens"],
    )


def add_eagle_heads(build_dir, config: EagleStageConfig | None = None, *, data_dir=None, device="cpu", overwrite: bool = False,
                    require_pass: bool = False, progress: bool = True) -> tuple[Path, dict]:
    """Train the EAGLE family for an existing build and commit ``eagle/``, ``eagle3/`` and its record into it;
    returns (build directory, new record). Everything is staged in a temporary directory inside the build; a
    failure leaves the build as it was. ``require_pass``: commit only when every check passes."""
    from specbench.zoo.build_record import commit_parts, read_record
    from specbench.zoo.registry import find_build_dir, make_readable

    build = find_build_dir(build_dir)
    record = read_record(build)
    config = config or SCALES.get(record["scale"], TEST)
    existing = [name for name in HEAD_DIRS if (build / name).exists()]
    if existing and not overwrite:
        raise EagleHeadsExist(f"{build} already has {existing}; pass --overwrite to retrain them")
    staging = Path(tempfile.mkdtemp(prefix=".eagle.", suffix=".partial", dir=build))
    try:
        inputs = stage_inputs_for_build(build, record, config, data_dir, device)
        section = eagle_family(staging, inputs, config, seed=record["seed"], device=device, progress=progress)
        section["base_sha256"] = part_digests(build, ("target",))
        new = with_eagle(record, section, config, build, MAX_TOTAL_BYTES)
        if require_pass and not new["passed"]:
            failed = [name for name, ok in new["checks"].items() if not ok]
            figures = {k: round(v["mean_acceptance_length"], 3) for k, v in section["acceptance"].items()
                       if isinstance(v, dict) and "mean_acceptance_length" in v}
            raise ValueError(f"{build}: the EAGLE heads fail {failed} (MAL {figures}); nothing was written (pass --force "
                             "to write them anyway)")
        make_readable(staging)
        commit_parts(build, staging, HEAD_DIRS, new)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return build, new


def install_eagle_heads(build_dir, *, artifacts_dir=None, force: bool = False) -> Path:
    """Add a build's ``eagle/``, ``eagle3/`` and record to the installed build, which must hold byte-identical
    target, Medusa, draft and tree files (sha256); those are never touched. A failed record is refused unless
    ``force``. Returns the installed build."""
    from specbench.references import ARTIFACTS_DIR, BUILD_NAME
    from specbench.zoo.build_record import commit_parts, read_record
    from specbench.zoo.registry import find_build_dir, make_readable

    build = find_build_dir(build_dir)
    record, installed = read_record(build), (Path(artifacts_dir) if artifacts_dir else ARTIFACTS_DIR) / BUILD_NAME
    if any(not (build / name).is_dir() for name in HEAD_DIRS) or "eagle" not in record:
        raise FileNotFoundError(f"{build} has no EAGLE heads; run `specbench zoo eagle {build_dir}` first")
    if not record["passed"] and not force:
        raise ValueError(f"{build}: not installed: failed checks {[k for k, ok in record['checks'].items() if not ok]}; "
                         "pass --force to install anyway")
    if installed.resolve() == build.resolve():
        return installed
    ours, theirs = part_digests(build, PARTS), part_digests(installed, PARTS)
    if ours != theirs:
        differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        raise ValueError(f"{installed} is another build ({differ[:3]} differ from {build}'s): its heads would not fit; "
                         f"install the whole build with `specbench zoo install {build_dir}`")
    staging = Path(tempfile.mkdtemp(prefix=".eagle.", suffix=".partial", dir=installed))
    try:
        for name in HEAD_DIRS:
            shutil.copytree(build / name, staging / name)
        make_readable(staging)
        commit_parts(installed, staging, HEAD_DIRS, record)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return installed
