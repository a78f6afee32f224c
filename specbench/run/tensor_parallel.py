"""Run a case with its target sharded over ranks, launched here or under torchrun, rank 0 drafting for all (docs/tensor_parallel.md)."""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.distributed as dist

from specbench.compile_watch import capture_seconds
from specbench.engine.draft import Draft
from specbench.engine.proposer import ProposerState, Proposer, SlotProposer, PerSlotProposer
from specbench.run.sequence import decode_case
from specbench.cases.requirements import expand_ref
from specbench.cases import Case
from specbench.distributed import (RankContext, RankFailed, TensorParallelCaseError, TorchrunRankFailed,
                                   environment_record, init_from_env, launch)
from specbench.env import with_distributed
from specbench.run.parts import RunResult, build_proposer, load_target

SET_IT = "set tensor_parallel (--tensor-parallel N) to a size that divides them, or drop it"


def _label(case: Case) -> str:
    return f"case {case.case_id} at tensor_parallel = {case.tensor_parallel}"


def backend_for(case: Case) -> str:
    """nccl for a CUDA case (one GPU per rank), gloo for a CPU one."""
    return "nccl" if case.device.startswith("cuda") else "gloo"


def _target_config(case: Case):
    """The target's transformers config, read without loading its weights."""
    from specbench.checkpoints.tiny import BUILTIN_TARGETS

    if case.target in BUILTIN_TARGETS:
        return BUILTIN_TARGETS[case.target](torch.float32).config
    from transformers import AutoConfig

    from specbench.checkpoints.resolve import resolve_model_dir

    directory = resolve_model_dir(expand_ref(case.target))
    return AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)


def check_tensor_parallel(case: Case) -> None:
    """Refuse, before any rank starts, a target that is not of the Llama family, head counts or an MLP width
    that do not divide by the case's tensor_parallel, or fewer GPUs than ranks."""
    from specbench.engine.static_llama import LlamaShape, UnsupportedModel
    from specbench.engine.tensor_parallel import NotShardable, check_shardable

    try:
        check_shardable(LlamaShape.from_config(_target_config(case)), case.tensor_parallel)
    except UnsupportedModel as err:
        raise ValueError(f"{_label(case)}: tensor parallelism shards Llama-family targets on the static engine, "
                         f"and target {case.target!r} is not one ({err}); drop tensor_parallel") from None
    except NotShardable as err:
        raise ValueError(f"{_label(case)}: target {case.target!r}: {err}; {SET_IT}") from None
    if backend_for(case) == "nccl":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count < case.tensor_parallel:
            raise ValueError(f"{_label(case)} needs {case.tensor_parallel} CUDA devices, one per rank, and this "
                             f"machine has {count}; set tensor_parallel <= {count} or run on a larger machine")


def _share_cpu(context: RankContext) -> None:
    """CPU ranks split the host's cores between them rather than each taking all of them."""
    if context.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // context.world_size))


def request_tokens(requests: list[dict]) -> list[tuple]:
    """(prompt id, repeat, speculative tokens, plain tokens) per request record: what every rank must agree on."""
    return [(r["prompt_id"], r["repeat"], r["output_token_ids"], r["plain_output_token_ids"]) for r in requests]


def rank_result(context: RankContext, case: Case, progress: bool) -> RunResult:
    """This rank's run: the sharded target, the proposer drafting on rank 0 for all, run_case's loop, and the
    environment record (a collective); progress bars on rank 0 only."""
    from specbench.engine.tensor_parallel import TensorParallelStaticTarget

    _share_cpu(context)
    target, tokenizer = load_target(case, static_class=TensorParallelStaticTarget, device=str(context.device))
    inner = build_proposer(case, target)
    proposer = None if inner is None else RankZeroProposer(inner, device=context.device)
    result = decode_case(case, target, tokenizer, proposer, progress=progress and context.rank == 0)
    result.env = with_distributed(result.env, environment_record(context.device), case.tensor_parallel)
    return result


def case_on_rank(context: RankContext, case: Case, progress: bool) -> RunResult | list[tuple]:
    """What a launched rank sends back: rank 0 its RunResult, the others only their request tokens."""
    result = rank_result(context, case, progress)
    return result if context.rank == 0 else request_tokens(result.requests)


def check_ranks_agree(case: Case, rank0: RunResult, others: list[list[tuple]]) -> None:
    """Every rank emitted rank 0's tokens for every request, plain and speculative; else the case fails
    naming the first rank and request that differ."""
    want = request_tokens(rank0.requests)
    for rank, got in enumerate(others, start=1):
        if len(got) != len(want):
            raise TensorParallelCaseError(f"{_label(case)}: rank {rank} decoded {len(got)} requests, rank 0 "
                                          f"{len(want)}", rank=rank)
        for (prompt_id, repeat, spec, plain), (_, _, rank_spec, rank_plain) in zip(want, got):
            if (spec, plain) != (rank_spec, rank_plain):
                which = "speculative" if spec != rank_spec else "plain"
                raise TensorParallelCaseError(
                    f"{_label(case)}: rank {rank} emitted other {which} tokens than rank 0 for request {prompt_id} "
                    f"(repeat {repeat}); the ranks' logits differ (a missing all-reduce, or unequal weights)",
                    rank=rank)


def _in_torchrun_group(case: Case, progress: bool) -> RunResult:
    """Under torchrun (WORLD_SIZE > 1 already set): join its group (left joined for the next case), run this
    rank, check on every rank that all ranks emitted the same tokens, and return this rank's result. A rank
    that raises on its share raises TorchrunRankFailed: its peers are stuck in a collective, so the process
    must end (``specbench run`` exits non-zero and torchrun stops the others) rather than run the next case."""
    import torch.distributed as dist

    world_size = int(os.environ["WORLD_SIZE"])
    if world_size != case.tensor_parallel:
        raise ValueError(f"{_label(case)} runs under torchrun with WORLD_SIZE={world_size}; start torchrun with "
                         f"--nproc-per-node {case.tensor_parallel}, or set tensor_parallel = {world_size}")
    try:
        context = init_from_env(backend_for(case))
        mine = rank_result(context, case, progress)
        everyone = [None] * world_size
        dist.all_gather_object(everyone, request_tokens(mine.requests))
    except Exception as err:
        raise TorchrunRankFailed(int(os.environ.get("RANK", "0")), world_size, _label(case), err) from err
    # every rank checks the same gathered tokens, so every rank takes the same verdict: a case error, the
    # group still in step for the next case
    check_ranks_agree(case, _tokens_result(case, everyone[0]), everyone[1:])
    return mine


def _tokens_result(case: Case, tokens: list[tuple]) -> RunResult:
    """A RunResult holding only rank 0's request tokens (what check_ranks_agree reads)."""
    requests = [{"prompt_id": p, "repeat": r, "output_token_ids": s, "plain_output_token_ids": t}
                for p, r, s, t in tokens]
    return RunResult(case, {}, requests, {}, {}, {}, "")


def under_torchrun() -> bool:
    """torchrun (or another launcher) already started this process as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _single_process(case: Case, progress: bool) -> RunResult:
    """tensor_parallel = 1: the single-process loop, its record carrying the distributed fields (world size 1)."""

    target, tokenizer = load_target(case)
    result = decode_case(case, target, tokenizer, build_proposer(case, target), progress=progress)
    result.env = with_distributed(result.env, environment_record(case.device), 1)
    return result


def run_tensor_parallel_case(case: Case, *, progress: bool = True,
                             rank_main: Callable = case_on_rank) -> RunResult:
    """Run ``case`` over ``case.tensor_parallel`` ranks and return rank 0's result, after checking every rank
    emitted its tokens. Launches the ranks itself (specbench.distributed.launch, NCCL_NVLS_ENABLE=0), unless
    this process is already one of torchrun's ranks. ``rank_main`` is the body each launched rank runs."""
    if case.tensor_parallel == 1:
        return _single_process(case, progress)
    check_tensor_parallel(case)
    if under_torchrun():
        return _in_torchrun_group(case, progress)
    try:
        rank0, *others = launch(rank_main, case.tensor_parallel, (case, progress), backend=backend_for(case))
    except RankFailed as failure:
        raise TensorParallelCaseError(f"{_label(case)}: {failure}", rank=failure.rank) from failure
    check_ranks_agree(case, rank0, others)
    return rank0


def _draft_payload(draft: Draft | None) -> dict | None:
    """A draft as host tensors and flags (what rank 0 broadcasts); None for a plain step."""
    if draft is None:
        return None
    host = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
    return {"tokens": host(draft.tokens), "parents": host(draft.parents), "draft_probs": host(draft.draft_probs),
            "precomputed_depths": host(draft.precomputed_depths),
            "precomputed_tree_mask": host(draft.precomputed_tree_mask),
            "precomputed_is_chain": draft.precomputed_is_chain, "precomputed_depth": draft.precomputed_depth}


def _draft_from_payload(payload: dict | None, device: torch.device) -> Draft | None:
    if payload is None:
        return None
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in payload.items()}
    for key in ("precomputed_depths", "precomputed_tree_mask"):  # host-side shape buffers, as Draft builds them
        moved[key] = payload[key]
    return Draft(**moved)


class RankZeroProposer(SlotProposer):
    """``inner`` (a slot-form proposer, or a per-sequence one as the one slot) proposes on rank 0 only; its drafts
    are broadcast so every rank verifies the same ones. Every other call (reserve, begin_request,
    max_draft_tokens) runs on every rank, so the decode loops agree."""

    def __init__(self, inner: Proposer | SlotProposer, group=None, device: torch.device | str = "cpu"):
        self.inner = PerSlotProposer([inner]) if isinstance(inner, Proposer) else inner
        self.describe = inner.describe  # the proposer's own settings, per-sequence or not
        self.group = group
        self.device = torch.device(device)
        self.needs_hidden_states = self.inner.needs_hidden_states
        self.rank = dist.get_rank(group)
        self.drafts_received = 0  # drafts this rank verified that rank 0 proposed (tests read it)

    @property
    def max_draft_tokens(self) -> int:
        return self.inner.max_draft_tokens

    @property
    def capture_seconds(self) -> float:
        """The wrapped proposer's graph capture so far (rank 0's; a run checks that none happened while timed)."""
        return capture_seconds(self.inner)

    def reserve(self, num_tokens: int) -> None:
        if self.rank == 0:  # the other ranks never draft: no cache to size, no drafting graphs to capture
            self.inner.reserve(num_tokens)

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self.inner.begin_request(slot, prompt_ids)

    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        lengths = {slot: state.token_ids.numel() for slot, state in states.items()}  # host-known: no device sync
        drafts = self.inner.propose(states) if self.rank == 0 else None
        message = [(lengths, {s: _draft_payload(d) for s, d in drafts.items()}) if self.rank == 0 else None]
        dist.broadcast_object_list(message, group_src=0, group=self.group, device=_object_device(self.device))
        if self.rank == 0:
            return drafts  # its own tensors: a static tree keeps its identity (the target skips rewriting buffers)
        source_lengths, payloads = message[0]
        if source_lengths != lengths:
            raise RuntimeError(
                f"tensor-parallel ranks diverged: rank 0 drafts after {source_lengths} tokens per slot, rank "
                f"{self.rank} is at {lengths}; their logits differ (a missing all-reduce, or ranks fed different prompts)"
            )
        self.drafts_received += sum(payload is not None for payload in payloads.values())
        return {slot: _draft_from_payload(payload, self.device) for slot, payload in payloads.items()}


def _object_device(device: torch.device) -> torch.device | None:
    """Where broadcast_object_list stages its bytes: the rank's GPU under NCCL, the host under gloo."""
    return device if device.type == "cuda" else None
