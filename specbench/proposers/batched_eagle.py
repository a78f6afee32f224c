"""The EAGLE proposer of B slots: one head over a batched draft cache drafts every active slot's chain or tree at once."""

from __future__ import annotations


import torch

from specbench.eagle.draft_head import BatchedDraftKVCache
from specbench.eagle.eagle3 import Eagle3Head
from specbench.engine.slot_proposer import SlotProposer
from specbench.engine.step_inputs import scatter_rows
from specbench.engine.draft import Draft, ancestor_mask
from specbench.engine.proposer import ProposerState
from specbench.engine.transfers import host_to_device
from specbench.proposers.eagle import EagleProposer


def batched_mask(visible: torch.Tensor, block: torch.Tensor, keys: int) -> torch.Tensor:
    """(B, W, K) bool: row w of slot b sees that slot's entries ``[0, visible[b])`` and, through ``block`` ``(W, C)``
    (or per slot ``(B, W, C)``), entries ``visible[b] + c`` for ``block[w, c]``; nothing beyond (the padding of
    shorter slots, other slots' rows)."""
    batch, (width, columns) = visible.shape[0], block.shape[-2:]
    rel = torch.arange(keys, device=visible.device)[None, :] - visible[:, None]  # (B, K) entry index past visible
    inside = (rel >= 0) & (rel < columns)  # (B, K)
    index = rel.clamp(0, columns - 1)[:, None, :].expand(batch, width, keys)  # (B, W, K)
    picked = block.expand(batch, width, columns).gather(2, index)  # (B, W, K)
    return (rel < 0)[:, None, :] | (inside[:, None, :] & picked)  # (B, W, K)


class BatchedEagleProposer(SlotProposer):
    """An :class:`~specbench.proposers.eagle.EagleProposer` (EAGLE-1/2 or EAGLE-3 head, any of its three modes) for B
    slots: the head's weights shared, its own ``(2, B, KVH, S, D)`` draft cache with host-known per-slot lengths.
    A propose call runs one ragged catch-up forward over every slot (each slot's newly accepted positions, padded
    to the widest, with per-slot starts and a ``(B, W, K)`` mask), then one forward per expansion depth for all
    slots at once (chain: 1 row per slot; static tree: the level's expanded nodes per slot; dynamic tree: each
    slot's top_k frontier nodes, its selection row-wise top-k and stable sorts over ``(B, ...)`` tensors);
    argmax / top-k on the device. So the head runs 1 + (depth - 1) forwards per call whatever B, and each slot
    follows the single proposer's rules (catch-up from the committed positions, rotary positions, masks), so its
    drafts are the single proposer's; nothing is read back."""

    needs_hidden_states = True

    def __init__(self, proposer: EagleProposer, batch_size: int):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.single, self.head, self.batch_size = proposer, proposer.head, batch_size
        self.device = proposer.head.fc.weight.device
        self.cache: BatchedDraftKVCache = self.head.new_batched_cache(batch_size)
        self._rows = torch.arange(batch_size, device=self.device)  # (B,)
        hidden = self.head.config.hidden_size
        # catch-up features: the target's (T - 1, H) hidden states, or EAGLE-3's (T - 1, 3H) aux features
        self._feature_width = self.head.fc.in_features - (0 if isinstance(self.head, Eagle3Head) else hidden)
        if proposer.mode == "dynamic":
            self._template = None  # each slot's shape is its own, built on the device
        elif proposer.mode == "chain":
            self._template = Draft.chain(torch.zeros(proposer.num_nodes, dtype=torch.long, device=self.device))
        else:
            tree = proposer.plan.tree
            self._template = Draft(tokens=torch.zeros(tree.num_nodes, dtype=torch.long, device=self.device),
                                   parents=tree.parents, precomputed_depths=tree.depths,
                                   precomputed_tree_mask=tree.tree_mask, precomputed_is_chain=tree.is_chain,
                                   precomputed_depth=tree.max_depth)

    @classmethod
    def from_proposer(cls, proposer: EagleProposer, batch_size: int) -> "BatchedEagleProposer":
        """The batched form of ``proposer`` (its head shared)."""
        return cls(proposer, batch_size)

    @property
    def max_draft_tokens(self) -> int:
        return self.single.max_draft_tokens

    def describe(self) -> dict:
        # the batched forwards run eagerly (draft graphs are the single proposer's, per width at B = 1)
        return {**self.single.describe(), "draft_graphs": False,
                "batching": f"batched head ({self.single.mode})"}

    # -- per slot ------------------------------------------------------------------------------------

    def reserve(self, num_tokens: int) -> None:
        self.cache.reserve(num_tokens + self.single.expansion_slots)

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self.cache.lengths[slot] = 0  # per slot: draft positions whose KV holds the target's features

    # -- propose -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        if not states:
            return {}
        for slot in range(self.batch_size):  # a slot no longer decoding starts over when it gets a request
            if slot not in states:
                self.cache.lengths[slot] = 0
        root_hidden = self._catch_up(states)  # (B, H)
        root_logits = self.single._logits(root_hidden)  # (B, V) predicts depth 1
        committed = host_to_device(self.cache.lengths, self.device)  # (B,) the draft nodes go after, never committed
        if self.single.mode == "dynamic":
            return self._dynamic_tree(root_hidden, root_logits, committed, list(states))
        if self.single.mode == "chain":
            tokens = self._chain(root_hidden, root_logits, committed)  # (B, K)
        else:
            tokens = self._static_tree(root_hidden, root_logits, committed)  # (B, N)
        return {slot: self._template.with_tokens(tokens[slot]) for slot in states}

    def _catch_up(self, states: dict[int, ProposerState]) -> torch.Tensor:
        """One ragged forward over every slot's positions accepted since its last call (the single proposer's
        ``_catch_up`` per slot: from ``min(committed, T - 2)``, at least the last one redone); returns ``(B, H)``
        the draft's output at each slot's last position (idle rows: anything)."""
        batch, device = self.batch_size, self.device
        starts, counts, new_tokens, new_features = [0] * batch, [1] * batch, {}, {}
        for slot, state in states.items():
            tokens, features = state.token_ids, state.hidden_states
            need = tokens.numel() - 1  # draft positions 0 .. T - 2, host-known from the view's shape
            if features is None or features.dim() != 2 or features.shape[0] != need or need < 1:
                got = None if features is None else tuple(features.shape)
                raise ValueError(f"the EAGLE proposer needs the target's hidden states ({need}, F) for slot {slot}'s "
                                 f"{tokens.numel()} tokens, got {got}")
            if features.shape[1] != self._feature_width:
                raise ValueError(f"the EAGLE head reads {self._feature_width}-wide features, slot {slot} has "
                                 f"{features.shape[1]} (an EAGLE-3 head needs the batched target's set_aux_layers)")
            start = min(self.cache.lengths[slot], need - 1)
            starts[slot], counts[slot] = start, need - start
            new_tokens[slot], new_features[slot] = tokens[start + 1: need + 1], features[start:need]  # (n,), (n, F)
            self.cache.lengths[slot] = need
        width = max(counts)
        ids = torch.zeros(batch, width, dtype=torch.long, device=device)  # (B, W) padded with token 0
        feats = torch.zeros(batch, width, self._feature_width, dtype=self.head.fc.weight.dtype, device=device)  # (B, W, F)
        index = scatter_rows(ids, [(slot, 0, new_tokens[slot]) for slot in states], device)  # one indexed write each,
        scatter_rows(feats, [(slot, 0, new_features[slot]) for slot in states], device, index)  # through one index
        start = host_to_device(starts, device)  # (B,)
        slots = start[:, None] + torch.arange(width, device=device)[None, :]  # (B, W) rotary position = cache entry
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril_()  # (W, W)
        mask = batched_mask(start, causal, max(starts) + width)  # (B, W, K)
        self.cache.reserve(max(starts) + width)
        hidden = self.head.step_batched(self.single.embedding(ids), feats, slots, slots, mask, self.cache.kv)  # (B, W, H)
        last = host_to_device([n - 1 for n in counts], device)  # (B,)
        return hidden[self._rows, last]  # (B, H)

    def _expand(self, tokens, features, committed, depth: int, begin: int, sees: torch.Tensor):
        """One forward for all slots at one depth: ``tokens`` ``(B, W)`` reading ``features`` ``(B, W, H)``, written
        after each slot's committed entries and the ``begin`` nodes expanded before them, at rotary position
        ``committed - 1 + depth``; ``sees`` ``(W, begin + W)`` (or per slot ``(B, W, begin + W)``) over those
        nodes. Returns ``(B, W, H)``, ``(B, W, V)``."""
        batch, width = tokens.shape
        offsets = torch.arange(begin, begin + width, device=self.device)  # (W,)
        slots = committed[:, None] + offsets[None, :]  # (B, W)
        positions = (committed - 1 + depth)[:, None].expand(batch, width)  # (B, W) siblings share one
        keys = max(self.cache.lengths) + begin + width
        self.cache.reserve(keys)
        mask = batched_mask(committed, sees, keys)  # (B, W, K)
        hidden = self.head.step_batched(self.single.embedding(tokens), features, positions, slots, mask, self.cache.kv)
        return hidden, self.single._logits(hidden.flatten(0, 1)).view(batch, width, -1)  # (B, W, H), (B, W, V)

    def _chain(self, root_hidden, root_logits, committed) -> torch.Tensor:
        """``draft_chain`` for all slots: K greedy tokens ``(B, K)``, each the argmax after the previous one."""
        tokens = [root_logits.argmax(dim=-1)]  # (B,)
        hidden = root_hidden[:, None]  # (B, 1, H)
        for depth in range(1, self.single.num_nodes):
            sees = torch.ones(1, depth, dtype=torch.bool, device=self.device)  # every earlier chain node and itself
            hidden, logits = self._expand(tokens[-1][:, None], hidden, committed, depth, depth - 1, sees)
            tokens.append(logits[:, 0].argmax(dim=-1))  # (B,)
        return torch.stack(tokens, dim=1)  # (B, K)

    def _static_tree(self, root_hidden, root_logits, committed) -> torch.Tensor:
        """``draft_static_tree`` for all slots: depth by depth, each expanded node's children on its own top-k
        ranks; returns ``(B, N)`` every slot's node tokens."""
        plan = self.single.plan
        batch, k, rows = self.batch_size, plan.tree.top_k, 1 + plan.num_expanded
        table = torch.empty(batch, rows, k, dtype=torch.long, device=self.device)  # (B, 1 + E, k)
        table[:, 0] = root_logits.topk(k, dim=-1).indices
        outputs = root_hidden.new_empty(batch, rows, root_hidden.shape[-1])  # (B, 1 + E, H) row r: node's output
        outputs[:, 0] = root_hidden
        for depth, (begin, end) in enumerate(plan.levels, start=1):
            nodes = plan.expanded[begin:end]  # (W,)
            tokens = table.view(batch, -1)[:, plan.candidates[nodes]]  # (B, W) their parents' rows are filled
            features = outputs[:, plan.parent_rows[begin:end]]  # (B, W, H)
            hidden, logits = self._expand(tokens, features, committed, depth, begin, plan.sees[begin:end, :end])
            outputs[:, 1 + begin: 1 + end] = hidden
            table[:, 1 + begin: 1 + end] = logits.topk(k, dim=-1).indices  # (B, W, k)
        return table.view(batch, -1)[:, plan.candidates]  # (B, N)

    def _dynamic_tree(self, root_hidden, root_logits, committed, slots: list[int]) -> dict[int, Draft]:
        """``draft_dynamic_tree`` for all slots (EAGLE-2): each slot's own frontier (its top_k best nodes by
        cumulative draft log-probability) expanded one level per forward, then its ``total_tokens`` best
        candidates kept (``select_nodes`` row by row); a draft per active slot in ``slots``, its shape built on the
        device."""
        single, device = self.single, self.device
        batch, k, total, depth = self.batch_size, single.top_k, single.total_tokens, single.depth
        scores, tokens = torch.log_softmax(root_logits.float(), dim=-1).topk(k, dim=-1)  # (B, k) each
        all_scores, all_tokens = [scores], [tokens]
        all_parents = [torch.full((batch, k), -1, dtype=torch.long, device=device)]
        all_levels = [torch.ones(k, dtype=torch.long, device=device)]  # each candidate's depth: its level
        frontier = torch.arange(k, device=device).expand(batch, k)  # (B, k) candidate index of each frontier node
        features = root_hidden[:, None].expand(batch, k, root_hidden.shape[-1])  # (B, k, H)
        itself = torch.eye(k, dtype=torch.bool, device=device).expand(batch, k, k)  # (B, k, k)
        sees, offset = itself, k  # (B, k, k) over the nodes expanded so far
        for level in range(1, depth):
            hidden, logits = self._expand(tokens, features, committed, level, k * (level - 1), sees)  # (B, k, H), (B, k, V)
            child_logp, child_tokens = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)  # (B, k, k) each
            child_scores = (scores[:, :, None] + child_logp.clamp(max=0.0)).flatten(1)  # (B, k * k)
            all_scores.append(child_scores)
            all_tokens.append(child_tokens.flatten(1))
            all_parents.append(frontier.repeat_interleave(k, dim=1))
            all_levels.append(torch.full((k * k,), level + 1, dtype=torch.long, device=device))
            scores, best = child_scores.topk(k, dim=-1)  # (B, k) the next frontier
            source = best // k  # (B, k) the frontier row each comes from
            frontier, tokens = offset + best, child_tokens.flatten(1).gather(1, best)
            features = hidden.gather(1, source[:, :, None].expand(-1, -1, hidden.shape[-1]))  # (B, k, H)
            sees = torch.cat([sees.gather(1, source[:, :, None].expand(-1, -1, sees.shape[-1])), itself], dim=2)
            offset += k * k
        # select_nodes per row: a stable descending sort keeps every kept node's ancestors
        candidates, parents_all = torch.cat(all_scores, dim=1), torch.cat(all_parents, dim=1)  # (B, C) each
        order = torch.sort(candidates, dim=1, descending=True, stable=True).indices[:, :total]
        keep = order.sort(dim=1).values  # (B, N) candidate order: parents before children
        parent = parents_all.gather(1, keep)  # (B, N)
        index = torch.searchsorted(keep, parent.clamp(min=0)) + 1  # (B, N) verify-input index of a kept parent
        parents = torch.where(parent < 0, torch.zeros_like(index), index)  # (B, N)
        levels = torch.cat(all_levels)[keep]  # (B, N)
        depths = torch.cat([levels.new_zeros(batch, 1), levels], dim=1)  # (B, N + 1)
        masks = ancestor_mask(parents, depth)  # (B, N + 1, N + 1)
        ids = torch.cat(all_tokens, dim=1).gather(1, keep)  # (B, N)
        chain = True if k == 1 else (False if total > depth else None)  # as draft_dynamic_tree
        return {b: Draft(tokens=ids[b], parents=parents[b], precomputed_depths=depths[b], precomputed_tree_mask=masks[b],
                         precomputed_is_chain=chain, precomputed_depth=total if k == 1 else None) for b in slots}



