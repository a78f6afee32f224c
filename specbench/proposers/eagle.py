"""EAGLE proposer over B slots: a draft head over the target's features drafts every slot's top-1 chain, EAGLE-1
static tree or EAGLE-2 dynamic tree at once, catching each slot's draft cache up with the target's features of its
accepted tokens every step, eagerly or through captured graphs (docs/eagle.md)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from specbench.eagle.captured import COMMITTED, CapturedHead, check_features
from specbench.eagle.draft_head import EagleHead
from specbench.eagle.drafting import drafting
from specbench.engine.draft import Draft
from specbench.engine.graph_capture import GraphBackend, StepGraphs
from specbench.engine.proposer import ProposerState, SlotProposer
from specbench.engine.static_ops import EAGER_OPS, StepOps
from specbench.medusa.trees import TreeSpec
from specbench.proposers.registry import register_proposer


@register_proposer
class EagleProposer(SlotProposer):
    name = "eagle"
    needs_hidden_states, queues_ahead = True, True
    head_label, head_type = "EAGLE", "EagleHead"  # how from_options' refusals name the head

    def __init__(self, head: EagleHead, lm_head: nn.Module, embedding: nn.Module | None = None, *, batch_size: int = 1,
                 num_speculative_tokens: int | None = None, tree: TreeSpec | None = None, top_k: int | None = None,
                 depth: int | None = None, total_tokens: int | None = None, cuda_graphs: bool = False,
                 graph_backend: GraphBackend | None = None, ops: StepOps = EAGER_OPS):
        """``cuda_graphs``: capture the draft's forwards (on CUDA, or through ``graph_backend``, a test's stand-in);
        ``ops``: their pointwise stages (``from_options``: the target's, compiled beside a compiling static target)."""
        options = dict(num_speculative_tokens=num_speculative_tokens, tree=tree, top_k=top_k, depth=depth,
                       total_tokens=total_tokens)
        self.drafting = drafting(int(lm_head.weight.shape[0]), head.fc.weight.device, **options)
        self.mode, self.plan, self.rule = self.drafting.mode, self.drafting.plan, self.drafting.rule
        self.num_nodes, self.expansion_slots, self.max_depth = (self.drafting.num_nodes,
                                                                 self.drafting.expansion_slots, self.drafting.max_depth)
        self.top_k, self.depth, self.total_tokens = top_k, depth, total_tokens
        self.head = head.prepare()
        self.lm_head = lm_head
        self.embedding = head.embed_tokens if head.embed_tokens is not None else embedding
        if self.embedding is None:
            raise ValueError("this draft head has no embed_tokens of its own; pass the target's embedding")
        self._graph_options, self._ops = (cuda_graphs, graph_backend), ops
        self._set_batch_size(batch_size)

    def _set_batch_size(self, batch_size: int) -> None:
        """Per-slot state for ``batch_size`` slots: the draft cache and its steps, eager or captured (beside a
        capturing static target, docs/eagle.md#graph-capture-on-the-static-engine)."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.batch_size, self._capacity, self._fresh = batch_size, 0, {}  # _fresh: slot -> its new prompt's length
        graphs = StepGraphs.for_device(self.head.fc.weight.device, *self._graph_options)
        self.captured = CapturedHead(self.head, self.embedding, self._logits, graphs, batch_size=batch_size,
                                     expansion_slots=self.expansion_slots, rule=self.rule, ops=self._ops)
        self.cache = self.captured.cache  # (2, B, KVH, S, D); lengths: draft positions holding the target's features

    def with_batch_size(self, batch_size: int) -> "EagleProposer":
        """This proposer for ``batch_size`` slots (``for_batch``): the head, drafting rule and graph setting shared,
        its own draft cache and graphs."""
        if batch_size == self.batch_size:
            return self
        other = copy.copy(self)
        other._set_batch_size(batch_size)
        return other

    @classmethod
    def from_options(cls, target, *, head: EagleHead | None = None, path: str | None = None,
                     num_speculative_tokens: int | None = None, tree: TreeSpec | None = None, top_k: int | None = None,
                     depth: int | None = None, total_tokens: int | None = None, cuda_graphs: bool | None = None,
                     graph_backend: GraphBackend | None = None) -> "EagleProposer":
        """A head from ``head`` (a module) or ``path`` (a checkpoint reference), moved to the target's device and
        dtype, for the target's batch size; the target's lm_head scores its outputs and its embedding serves heads
        without embed_tokens. ``cuda_graphs`` None captures the draft's forwards exactly when the target captures
        its steps. A subclass changes the head it reads and the proposer it builds through the hooks below
        (Eagle3Proposer's: the head's own lm_head, the target asked for its aux-layer features)."""
        if (head is None) == (path is None):
            raise ValueError(f"{cls.head_label} needs exactly one of head (an {cls.head_type}) or path (a checkpoint); "
                             f"got head={type(head).__name__ if head is not None else None}, path={path!r}")
        if path is not None:
            head = cls._load_head(target, path)
        elif not cls._head_fits(head, target):
            raise ValueError(f"the {cls.head_label} head has hidden_size {head.config.hidden_size} and vocab_size "
                             f"{head.config.vocab_size}; the target has {target.hidden_size} and {target.vocab_size}")
        head = head.to(device=target.device, dtype=target.dtype)
        if cuda_graphs is None:  # as the target's steps: captured on a static target with graphs on, else eager
            cuda_graphs = bool(getattr(target, "cuda_graphs", False))
        drafting = dict(batch_size=target.batch_size, num_speculative_tokens=num_speculative_tokens, tree=tree,
                        top_k=top_k, depth=depth, total_tokens=total_tokens, cuda_graphs=cuda_graphs,
                        graph_backend=graph_backend, ops=getattr(target, "ops", EAGER_OPS))
        return cls._for_target(target, head, drafting)

    # -- from_options' hooks: what differs between an EAGLE-1/2 head and an EAGLE-3 one -------------------

    @classmethod
    def _load_head(cls, target, path: str) -> EagleHead:
        """The checkpoint at ``path``, checked against the target's sizes, in its dtype on its device."""
        from specbench.eagle.checkpoint import load_eagle_head  # checkpoint formats load only when asked for

        return load_eagle_head(path, target_hidden_size=target.hidden_size, target_vocab_size=target.vocab_size,
                               dtype=target.dtype, device=target.device)

    @classmethod
    def _head_fits(cls, head: EagleHead, target) -> bool:
        """The hidden size always; the vocabulary only where the head embeds with its own embed_tokens."""
        vocab_fits = head.embed_tokens is None or head.config.vocab_size == target.vocab_size
        return head.config.hidden_size == target.hidden_size and vocab_fits

    @classmethod
    def _for_target(cls, target, head: EagleHead, drafting: dict) -> "EagleProposer":
        """The proposer for ``head`` (on the target's device) with ``drafting``, __init__'s keyword options: scored
        through the target's lm_head, embedding through the target's embedding unless the head has its own."""
        return cls(head, target.lm_head, None if head.embed_tokens is not None else target.embed_tokens, **drafting)

    @property
    def max_draft_tokens(self) -> int:
        return self.num_nodes

    def describe(self) -> dict:
        embed = "own" if self.head.embed_tokens is not None else "target"
        graphs = self.captured.graphs
        settings = {"name": self.name, "mode": self.mode, "embed_tokens": embed, "draft_graphs": graphs.enabled,
                    "draft_capture_seconds": graphs.capture_seconds, "batching": f"batched head ({self.mode})"}
        if self.mode == "chain":
            settings["num_speculative_tokens"] = self.num_nodes
        elif self.mode == "tree":
            tree = self.plan.tree
            settings.update(tree=tree.name or "custom", tree_nodes=tree.num_nodes, tree_depth=tree.max_depth)
        else:
            settings.update(top_k=self.top_k, depth=self.depth, total_tokens=self.total_tokens)
        return settings

    @property
    def feature_width(self) -> int:
        """F of the target features each draft position reads: EAGLE-1/2's ``fc`` takes the embedding and F = H."""
        return self.head.fc.in_features - self.head.config.hidden_size

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # (R, V): the draft's output goes through the target's lm_head as it is

    # -- per request -----------------------------------------------------------------------------------

    @property
    def capture_seconds(self) -> float:
        """The drafting graphs' capture so far (a run checks that none happened while timed)."""
        return self.captured.graphs.capture_seconds

    def reserve(self, num_tokens: int) -> None:
        """Draft-cache room for requests of ``num_tokens`` tokens plus one step's expansion in every slot; with
        drafting graphs on, every graph a request can replay is captured here, before any clock starts."""
        self._capacity = max(self._capacity, num_tokens + self.expansion_slots, self._PREPARE_PROMPT + self.max_depth
                             + 2 + self.expansion_slots)
        self.captured.reserve(self._capacity)
        self._prepare_graphs()
        self.cache.lengths, self._fresh = [0] * self.batch_size, {}

    _PREPARE_PROMPT = 1  # the dummy request's prompt length: its first catch-up (eager) is one position

    @torch.inference_mode()
    def _prepare_graphs(self) -> None:
        """Capture the drafting graphs on a dummy request of zeros in every slot: the draft step's (its shapes do not
        depend on the tokens) and a catch-up of every width a step can bring, 1 to ``max_depth`` + 1 (the accepted
        tokens and the bonus one). Skipped when the graphs over this draft cache exist."""
        captured = self.captured
        if not captured.enabled or captured.prepared_over is self.cache.kv:
            return
        base, widths = self._PREPARE_PROMPT, range(1, self.max_depth + 2)
        tokens = torch.zeros(base + widths[-1] + 1, dtype=torch.long, device=self.cache.kv.device)  # (T,)
        features = tokens.new_zeros(tokens.numel() - 1, self.feature_width, dtype=self.cache.kv.dtype)  # (T - 1, F)
        slots = range(self.batch_size)
        self._draft({b: ProposerState(token_ids=tokens[: base + 1], hidden_states=features[:base]) for b in slots})
        for width in widths:  # each catch-up starts at the same position: `width` new ones
            self.cache.lengths = [base] * self.batch_size
            self._draft({b: ProposerState(token_ids=tokens[: base + width + 1], hidden_states=features[: base + width])
                         for b in slots})
        captured.prepared_over = self.cache.kv

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self.captured.reserve(max(self._capacity, prompt_ids.numel() + self.expansion_slots + 1))
        self.cache.lengths[slot], self._fresh[slot] = 0, prompt_ids.numel()  # its first catch-up: the prompt's
        self.captured.slots[COMMITTED, slot] = 0  # (queued ahead, the device's count is the one read)

    # -- propose -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        if not states:
            return {}
        drafts = self._draft(states)
        return {slot: drafts[slot] for slot in states}

    @torch.inference_mode()
    def propose_queued(self, history, lengths: dict[int, int]) -> dict[int, Draft | None]:
        """``propose`` for a step queued ahead of the host's reads: every slot's catch-up formed on the device from the
        history (padded to the deepest accepted path + 1, the captured width; a step beginning a request: its
        prompt's, eagerly), then the draft step (docs/eagle.md#catch-up)."""
        prompts = [self._fresh.pop(b) for b in lengths if b in self._fresh]
        check_features(history.features, self.feature_width, next(iter(lengths)))
        root = self.captured.follow(history.tokens, history.features, history.lengths,
                                    max([self.max_depth + 1, *prompts]), replayable=not prompts)
        drafts = self.rule.shape(self.captured.draft(*root))
        for draft in drafts:  # greedy (queued ahead): a tree whose chain shape only the device knows verifies as a tree
            draft.precomputed_is_chain = bool(draft.precomputed_is_chain)
        return {b: drafts[b] for b in lengths}

    def _draft(self, states: dict[int, ProposerState]) -> list[Draft]:
        """Every slot's draft (an idle slot's is discarded): one catch-up step, then the draft step (every expansion
        depth and the rule between them)."""
        return self.rule.shape(self.captured.draft(*self._catch_up(states)))

    def _catch_up(self, states: dict[int, ProposerState]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.captured.catch_up_states(states, self.feature_width, self.max_depth)  # (B, H), (B, V): depth 1
