"""Tensor parallelism on the CPU (gloo, 2 ranks): TP=2 decodes token for token as TP=1 with equal counters,
every rank emits the same tokens, sizes that do not divide are refused, and a failing rank fails the launch
with its own message and leaves no process behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from specbench.distributed import RankFailed, environment_record, launch
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.static_llama import LlamaShape
from specbench.engine.static_target import StaticTarget
from specbench.engine.tensor_parallel import NotShardable, check_shardable, local_shape
from _prompts import random_prompt, repetitive_prompt

WORLD = 2
MAX_NEW = 32
VOCAB, HIDDEN = 256, 64
REFERENCE, REFERENCE_MEDUSA = "specbench-ref/gsm8k-tiny", "specbench-ref/gsm8k-tiny-medusa"
GQA = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,  # wide: no fp32 argmax ties
           bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
           attention_bias=True, mlp_bias=True)  # biases: column-parallel ones sharded, row-parallel ones added once
GQA_PROPOSERS = ("plain", "ngram", "medusa-chain-k3", "medusa-tree-63")
REFERENCE_PROPOSERS = ("plain", "medusa-chain-k3", "eagle-chain-k3")  # EAGLE: a slot proposer inside RankZeroProposer


def random_heads():
    from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        heads = MedusaHeads(MedusaHeadsConfig(5, 1, HIDDEN, VOCAB, True))
        for name, p in heads.named_parameters():
            nn.init.normal_(p, std=0.5 if name.endswith("bias") else 0.2)
    return heads


def make_proposer(label: str, target, medusa_path: str | None):
    from specbench.proposers.medusa import MedusaProposer
    from specbench.proposers.ngram import NgramProposer

    if label == "plain":
        return None
    if label == "ngram":
        return NgramProposer(num_speculative_tokens=3)
    if label == "eagle-chain-k3":
        from specbench.proposers.eagle import EagleProposer

        return EagleProposer.from_options(target, path="specbench-ref/gsm8k-tiny-eagle", num_speculative_tokens=3)
    options = {"num_speculative_tokens": 3} if label == "medusa-chain-k3" else {"tree": "gsm8k-tiny-63"}
    source = {"path": medusa_path} if medusa_path else {"heads": random_heads()}
    return MedusaProposer.from_options(target, **source, **options)


def decode_all(target, proposer_for, labels, prompts) -> dict:
    """label -> [(output token ids, counters)] per prompt."""
    results = {}
    for label in labels:
        proposer = proposer_for(label)
        decoder = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW))
        runs = [decoder.generate(torch.tensor(p)) for p in prompts]
        results[label] = [(r.output_token_ids, r.counters) for r in runs]
    return results


def tp_rank(context, jobs) -> dict:
    """One rank: shard each job's model over the group, decode its prompts with every proposer (drafted on
    rank 0 and broadcast), and report the tokens, counters, cache shape and environment record."""
    from specbench.engine.tensor_parallel import TensorParallelStaticTarget
    from specbench.run.tensor_parallel import RankZeroProposer

    torch.set_num_threads(1)
    out = {"env": environment_record(context.device)}
    for name, ref, medusa_path, labels, prompts in jobs:
        target = TensorParallelStaticTarget.from_pretrained(ref, dtype=torch.float32, device="cpu")
        wrapped = []

        def proposer_for(label):
            inner = make_proposer(label, target, medusa_path)
            if inner is None:
                return None
            wrapped.append(RankZeroProposer(inner, device=context.device))
            return wrapped[-1]

        out[name] = decode_all(target, proposer_for, labels, prompts)
        out[name + "/logits"] = target.prefill(0, torch.tensor(prompts[0])).logits  # (1, V) slot 0, reserved by the runs
        out[name + "/cache"] = tuple(target._cache.kv.shape)
        out[name + "/received"] = sum(p.drafts_received for p in wrapped)
    return out


def failing_rank(context, failing: int) -> None:
    if context.rank == failing:  # (this module imports transformers lazily, so a rank starts in seconds)
        raise ValueError(f"rank {context.rank} cannot load its shard: deliberately broken")
    torch.distributed.barrier()  # the healthy rank waits on the broken one: terminated, not hung


@pytest.fixture(scope="module")
def gqa_dir(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**GQA)).eval()
        for key, p in model.named_parameters():
            if key.endswith("bias"):  # transformers initialises biases to 0, which would test nothing
                nn.init.normal_(p, std=0.2)
    directory = tmp_path_factory.mktemp("gqa-tiny")
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def reference_prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    from specbench.checkpoints.resolve import resolve_model_dir
    from specbench.prompts import load_prompts

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(REFERENCE))
    return [list(p.token_ids) for p in load_prompts("gsm8k-embedded", num_prompts=3, tokenizer=tokenizer)]


@pytest.fixture(scope="module")
def jobs(gqa_dir, reference_prompts) -> list[tuple]:
    gqa_prompts = [repetitive_prompt(0).tolist(), repetitive_prompt(1).tolist(), random_prompt(12, 3).tolist()]
    return [("gqa", str(gqa_dir), None, GQA_PROPOSERS, gqa_prompts),
            ("reference", REFERENCE, REFERENCE_MEDUSA, REFERENCE_PROPOSERS, reference_prompts)]


@pytest.fixture(scope="module")
def tp1(jobs) -> dict:
    """The single-process static engine (batch size 1) on the same models, prompts and proposers."""
    out = {}
    for name, ref, medusa_path, labels, prompts in jobs:
        target = StaticTarget.from_pretrained(ref, dtype=torch.float32, device="cpu")
        out[name] = decode_all(target, lambda label: make_proposer(label, target, medusa_path), labels, prompts)
        out[name + "/logits"] = target.prefill(0, torch.tensor(prompts[0])).logits  # (1, V)
    return out


@pytest.fixture(scope="module")
def tp2(jobs) -> list[dict]:
    return launch(tp_rank, WORLD, (jobs,), backend="gloo")


@pytest.mark.parametrize("model", ["gqa", "reference"])
def test_tp2_greedy_decoding_equals_tp1_token_for_token(tp1, tp2, model):
    rank0 = tp2[0][model]
    assert set(rank0) == set(tp1[model]) == set(GQA_PROPOSERS if model == "gqa" else REFERENCE_PROPOSERS)
    for label, want in tp1[model].items():
        for prompt, ((want_ids, want_counters), (got_ids, got_counters)) in enumerate(zip(want, rank0[label])):
            assert len(got_ids) == MAX_NEW, (label, prompt)
            assert got_ids == want_ids, (label, prompt)
            assert got_counters == want_counters, (label, prompt)  # drafts, draft/accepted tokens, per position
    drafted = {label: sum(c.num_drafts for _, c in runs) for label, runs in rank0.items()}
    assert all((n > 0) == (label != "plain") for label, n in drafted.items()), drafted


@pytest.mark.parametrize("model", ["gqa", "reference"])
def test_every_rank_emits_the_tokens_of_rank_zeros_draft(tp2, model):
    """Rank 0 drafts and broadcasts; rank 1 verified every one of those drafts and emitted the same tokens."""
    assert tp2[1][model] == tp2[0][model]
    drafts = sum(c.num_drafts for runs in tp2[0][model].values() for _, c in runs)
    assert tp2[1][model + "/received"] == drafts > 0
    assert tp2[0][model + "/received"] == 0  # rank 0 proposes itself


@pytest.mark.parametrize("model", ["gqa", "reference"])
def test_every_rank_ends_with_the_same_logits(tp1, tp2, model):
    """After each block's all-reduce the ranks hold the same bits, so greedy verification agrees everywhere;
    against TP=1 only the summation order differs (two partial sums per projection)."""
    assert torch.equal(tp2[1][model + "/logits"], tp2[0][model + "/logits"])
    torch.testing.assert_close(tp2[0][model + "/logits"], tp1[model + "/logits"], atol=1e-4, rtol=0)


def test_each_rank_caches_only_its_kv_heads(tp2):
    for rank in range(WORLD):
        layers, two, slots, kv_heads, _, head_dim = tp2[rank]["gqa/cache"]  # (L, 2, B, KVH, S, D)
        assert (layers, two, slots, kv_heads, head_dim) == (2, 2, 1, 2 // WORLD, HIDDEN // 4)
        assert tp2[rank]["reference/cache"][3] == 4 // WORLD  # the reference model: 4 KV heads, 2 per rank


def test_environment_record_names_every_rank(tp2):
    env = tp2[0]["env"]
    assert env["world_size"] == WORLD and env["backend"] == "gloo"
    assert len(env["device_names"]) == WORLD and env["interconnect"] == "none (CPU, gloo)"
    assert env["hardware_class"] == "cpu" and tp2[1]["env"] == env
    single = environment_record()
    assert single["world_size"] == 1 and single["backend"] is None


def test_sizes_that_do_not_divide_are_refused_naming_them():
    from transformers import LlamaConfig

    shape = LlamaShape.from_config(LlamaConfig(**GQA))
    with pytest.raises(NotShardable, match=r"4 attention heads, 2 key/value heads and intermediate_size 128 over "
                                           r"tensor-parallel size 4: 2 key/value heads do not divide by 4.*\(1, 2\)"):
        check_shardable(shape, 4)
    with pytest.raises(NotShardable, match=r"size 3: 4 attention heads, 2 key/value heads, 128 intermediate_size do not divide by 3"):
        local_shape(shape, 3)
    half = local_shape(shape, 2)
    assert (half.num_heads, half.num_kv_heads, half.intermediate_size) == (2, 1, 64)


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every living descendant of ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append((child, command))
        stack.extend(children.get(child, []))
    return found


def test_a_failing_rank_fails_the_launch_with_its_message_and_leaves_no_process():
    # multiprocessing's resource tracker is the interpreter's one shared helper (started by the first spawn
    # of the session, it exits with this process), not a rank
    before = {pid for pid, _ in _descendants(os.getpid())}
    with pytest.raises(RankFailed, match=r"rank 1 failed: ValueError: rank 1 cannot load its shard: deliberately broken") as error:
        launch(failing_rank, WORLD, (1,), backend="gloo")
    assert error.value.rank == 1 and error.value.error_type == "ValueError"
    assert "failing_rank" in error.value.traceback
    left = [(pid, cmd) for pid, cmd in _descendants(os.getpid())
            if pid not in before and "multiprocessing.resource_tracker" not in cmd]
    assert not left, f"processes left behind: {left}"


def test_init_from_env_outside_torchrun_names_what_is_missing(monkeypatch):
    from specbench.distributed import init_from_env

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match=r"WORLD_SIZE, MASTER_ADDR, MASTER_PORT unset; run under torchrun"):
        init_from_env()
