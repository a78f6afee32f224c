"""The static Llama-family target (slot 0 of a batch of one) against transformers and HFTarget: logits, lossless
greedy decoding with identical counters, the KV cache after chain and tree commits, fixed verify widths, and its
refusals (a cache must be reserved first)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers import Qwen2Config, Qwen2ForCausalLM

from _random_heads import random_heads as shared_random_heads
from specbench.checkpoints.resolve import load_target_model, resolve_model_dir
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.draft import Draft
from specbench.engine.hf_target import HFTarget
from specbench.engine.static_cache import attention_spans
from specbench.engine.static_llama import StaticLlamaForCausalLM, LlamaShape, UnsupportedModel
from specbench.engine.static_target import StaticTarget
from specbench.engine.step_inputs import SlotInput
from specbench.medusa.heads import MedusaHeads
from specbench.proposers.medusa import MedusaProposer
from specbench.proposers.ngram import NgramProposer
from _prompts import random_prompt, repetitive_prompt

# fp32 logits of the two implementations differ only by accumulation order (other matmul shapes, padded
# verify widths, SDPA over the whole cache): ~1e-6 here; a wrong position, mask or cache entry moves them
# by O(0.1-1). 1e-4 separates the two.
LOGITS_ATOL = 1e-4
MAX_NEW = 24
VOCAB, HIDDEN = 256, 64
COMMON = dict(
    vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,  # wide: no fp32 argmax ties
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
# transformers adds rope_theta to a rope_scaling dict it is given: every config gets a copy of this one
LLAMA3 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
CONFIGS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, tie_word_embeddings=False)),
    "llama3-rope-tied": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, rope_scaling=dict(LLAMA3), tie_word_embeddings=True)),
    "llama-biases": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True, rope_theta=500000.0)),
    # head_dim 32 with hidden 64 and 4 heads: projections wider than the hidden size
    "mistral": lambda: MistralForCausalLM(MistralConfig(**COMMON, head_dim=32, sliding_window=None, tie_word_embeddings=False)),
    "qwen2-tied": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=True)),
}


def build(name: str, seed: int = 0) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CONFIGS[name]()
        for key, p in model.named_parameters():
            if key.endswith("bias"):  # transformers initialises biases to 0, which would test nothing
                nn.init.normal_(p, std=0.2)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    model = build(request.param)
    return request.param, model, HFTarget(model), StaticTarget.from_hf_model(model)


def random_heads(seed: int = 1) -> MedusaHeads:
    return shared_random_heads(HIDDEN, VOCAB, seed)


def random_tree(gen: torch.Generator, nodes: int) -> Draft:
    parents = [0] + [int(torch.randint(0, node, (1,), generator=gen)) for node in range(2, nodes + 1)]
    return Draft(tokens=torch.randint(0, VOCAB, (nodes,), generator=gen), parents=torch.tensor(parents))


def root_path(draft: Draft, node: int) -> list[int]:
    """The verify-input nodes from the root to ``node``, ascending: the accepted path that ends there."""
    path, parents = [node], [0] + draft.parents.tolist()
    while path[-1]:
        path.append(parents[path[-1]])
    return path[::-1]


def chain(ids) -> SlotInput:
    """Slot 0's verify input for a chain ``[root, *draft]``: depths 0..N-1, no tree mask."""
    return SlotInput(ids, torch.arange(len(ids)))


def decode(target, proposer, prompt, reserve: bool):
    """Decoder.generate; ``reserve`` sizes the target first (the loop reserves too; a larger cache is kept)."""
    room = proposer.max_draft_tokens if proposer else 0
    if reserve:
        target.reserve(prompt.numel() + MAX_NEW + room, room)
    return Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompt)


def assert_same_decoding(reference, static, proposer_for, prompts, reserve: bool) -> int:
    """Equal tokens and counters through HFTarget and StaticTarget; returns the drafts made."""
    drafts = 0
    for prompt in prompts:
        want = decode(reference, proposer_for(reference), prompt, reserve)
        got = decode(static, proposer_for(static), prompt, reserve)
        assert got.output_token_ids == want.output_token_ids
        assert got.counters == want.counters  # num_drafts, draft/accepted tokens, accepted_per_position, forwards
        drafts += got.counters.num_drafts
    # one fixed verify width per step kind over every step of every request
    assert all(len(widths) == 1 for widths in static.verify_widths.values()), static.verify_widths
    return drafts


def test_logits_and_hidden_states_match_transformers(pair):
    name, model, hf, static = pair
    torch.testing.assert_close(static.module.inv_freq, model.model.rotary_emb.inv_freq, atol=0, rtol=1e-6)
    ids = random_prompt(20, 3)
    with torch.inference_mode():
        full = model.model(ids[None]).last_hidden_state[0]  # (20, H)
        full_logits = model.lm_head(full).float()  # (20, V)
    static.reserve(64)
    out = static.prefill(0, ids[:16])
    torch.testing.assert_close(out.logits, full_logits[15:16], atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(out.hidden_states, full[:16], atol=LOGITS_ATOL, rtol=0)  # every prompt position
    step = static.verify([chain(ids[16:])])  # a chain of 4 after the cached 16: (1, W, V), its first 4 real
    torch.testing.assert_close(step.logits[0, :4], full_logits[16:], atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(step.hidden_states[0, :4], full[16:], atol=LOGITS_ATOL, rtol=0)
    static.commit([[0, 1]])
    hf.prefill(0, ids[:18])
    draft = random_tree(torch.Generator().manual_seed(5), 9)
    tree = [SlotInput(torch.cat([ids[18:19], draft.tokens]), draft.depths(), draft.tree_mask())]  # 10 nodes
    want, got = hf.verify(tree), static.verify(tree)  # (1, 10, V) and (1, W, V)
    torch.testing.assert_close(got.logits[0, :10], want.logits[0], atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(got.hidden_states[0, :10], want.hidden_states[0], atol=LOGITS_ATOL, rtol=0)
    path = root_path(draft, 3)  # node 3 and its ancestors: not a prefix, so its entries move
    for target in (hf, static):
        target.commit([path])
    assert static.cache_length(0) == hf.cache_length == 18 + len(path) and path != list(range(len(path)))
    after = [chain(ids[19:20])]  # one more step reads the gathered tree entries in both caches
    torch.testing.assert_close(static.verify(after).logits[0, :1], hf.verify(after).logits[0], atol=LOGITS_ATOL, rtol=0)
    for target in (hf, static):
        target.commit([[0]])


def test_greedy_decoding_equals_hf_target(pair):
    name, model, hf, static = pair
    prompts = [repetitive_prompt(0), repetitive_prompt(1)]
    heads = random_heads()
    proposers = {
        "plain": lambda target: None,
        "ngram": lambda target: NgramProposer(num_speculative_tokens=3),
        "medusa-chain": lambda target: MedusaProposer.from_options(target, heads=heads, num_speculative_tokens=3),
        "medusa-tree": lambda target: MedusaProposer.from_options(target, heads=heads, tree="gsm8k-tiny-63"),
    }
    for label, proposer_for in proposers.items():
        static.verify_widths.clear()
        drafts = assert_same_decoding(hf, static, proposer_for, prompts, reserve=True)
        assert (drafts > 0) == (label != "plain"), label
    assert set(static.verify_widths) == {"tree"} and static.verify_widths["tree"].keys() == {64}


def test_without_draft_room_a_kinds_width_is_its_first_steps_then_widened(pair):
    """reserve() without draft room leaves a kind's width to its first step, widened when a longer draft comes:
    still exact, and verify_widths shows the extra shape (what the decode loop's reserve(n, room) avoids)."""
    name, model, hf, static = pair
    fresh = StaticTarget.from_hf_model(model)
    fresh.reserve(40)  # no draft room
    prompt = random_prompt(12, 2)
    torch.testing.assert_close(fresh.prefill(0, prompt).logits, hf.prefill(0, prompt).logits, atol=LOGITS_ATOL, rtol=0)
    for step, n in enumerate((2, 4, 2)):  # chains of 2 then 4 then 2 draft-and-root nodes, the root kept each time
        ids = random_prompt(n, 20 + step)
        want, got = hf.verify([chain(ids)]), fresh.verify([chain(ids)])
        assert got.logits.shape[1] == (2 if step == 0 else 4)  # the first step's width, then the wider one's
        torch.testing.assert_close(got.logits[0, :n], want.logits[0], atol=LOGITS_ATOL, rtol=0)
        for target in (hf, fresh):
            target.commit([[0]])
    assert fresh.verify_widths == {"chain": {2: 1, 4: 2}}
    assert fresh.cache_length(0) == hf.cache_length == 15


def test_cache_after_random_chain_and_tree_commits_equals_fresh_prefill(pair):
    name, model, hf, static = pair
    gen = torch.Generator().manual_seed(7)
    tokens = random_prompt(10, 11).tolist()
    static.reserve(200, 7)  # chain and tree width 8
    static.verify_widths.clear()
    static.prefill(0, torch.tensor(tokens[:-1]))
    gathers = 0
    for step in range(14):
        if step % 2:  # a tree of 7 nodes; the accepted path ends at a random node
            draft = random_tree(gen, 7)
            path = root_path(draft, int(torch.randint(0, 8, (1,), generator=gen)))
            tree_mask = draft.tree_mask()
        else:  # a chain of 1..7 tokens, a random prefix accepted
            draft = Draft.chain(torch.randint(0, VOCAB, (int(torch.randint(1, 8, (1,), generator=gen)),), generator=gen))
            path = list(range(int(torch.randint(1, len(draft) + 2, (1,), generator=gen))))
            tree_mask = None
        verify_ids = torch.cat([torch.tensor(tokens[-1:]), draft.tokens])
        static.verify([SlotInput(verify_ids, draft.depths(), tree_mask)])
        static.commit([path])
        gathers += path != list(range(len(path)))
        tokens = tokens[:-1] + verify_ids[path].tolist() + [int(torch.randint(0, VOCAB, (1,), generator=gen))]
        assert static.cache_length(0) == len(tokens) - 1
        if step % 3 == 2 or step == 13:
            live = static.verify([chain(torch.tensor(tokens[-1:]))]).logits[0, 0]
            static.commit([[0]])
            tokens.append(int(live.argmax()))
            with torch.inference_mode():
                fresh = model(torch.tensor(tokens[:-1])[None]).logits[0, -1].float()
            torch.testing.assert_close(live, fresh, atol=LOGITS_ATOL, rtol=0)
    assert gathers >= 3, "the tree commits must move entries for this test to mean anything"
    assert {k: len(v) for k, v in static.verify_widths.items()} == {"chain": 1, "tree": 1, "plain": 1}


def test_every_verify_forward_has_one_width_per_kind(pair):
    """Each step kind verifies at one fixed width; the cache entries a step attends over are its attention span,
    one of the ladder's from the prompt's length up (engine/static_cache.attention_span)."""
    name, model, hf, static = pair
    fresh = StaticTarget.from_hf_model(model)
    shapes = []
    fresh.module.register_forward_pre_hook(lambda mod, args: shapes.append((args[0].shape, getattr(args[3], "shape", None))))
    heads = random_heads()
    prompts = [repetitive_prompt(0), random_prompt(13, 4)]
    for proposer in (NgramProposer(num_speculative_tokens=4), MedusaProposer(heads, num_speculative_tokens=3),
                     MedusaProposer(heads, tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])):
        for prompt in prompts:
            shapes.clear()
            decode(fresh, proposer, prompt, reserve=True)
            prefill, steps = shapes[0], set(shapes[1:])
            assert prefill == ((prompt.numel(),), None)  # a prefill attends causally within the prompt: no mask
            widths = {1, 5} if isinstance(proposer, NgramProposer) else {proposer.max_draft_tokens + 1}
            assert {ids[0] for ids, _ in steps} <= widths and len(steps) >= 1, steps
            for (width,), (batch, rows, span) in steps:  # ids (B * W,), mask (B, W, span)
                assert (batch, rows) == (1, width)
                assert span in attention_spans(prompt.numel() + width, fresh.cache_capacity), (span, width)
    assert fresh.cuda_graphs is False and fresh.capture_seconds == 0.0  # graphs are CUDA-only; CPU runs eager


# --- the shipped reference model: loaded from its checkpoint directory ---------------------------------


@pytest.fixture(scope="module")
def reference_pair():
    from transformers import AutoTokenizer

    from specbench.prompts import load_prompts

    model = load_target_model("specbench-ref/gsm8k-tiny", dtype=torch.float32, device="cpu")
    static = StaticTarget.from_pretrained("specbench-ref/gsm8k-tiny", dtype=torch.float32, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("specbench-ref/gsm8k-tiny"))
    prompts = [torch.tensor(p.token_ids) for p in load_prompts("gsm8k-embedded", num_prompts=3, tokenizer=tokenizer)]
    return model, HFTarget(model), static, prompts


def test_reference_model_prefill_logits_match(reference_pair):
    model, hf, static, prompts = reference_pair
    assert static.module.shape.tie_word_embeddings and static.max_context == hf.max_context == 1024
    static.reserve(prompts[0].numel())
    torch.testing.assert_close(static.prefill(0, prompts[0]).logits, hf.prefill(0, prompts[0]).logits,
                               atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("proposer", ["plain", "ngram", "medusa-chain-k3", "medusa-tree-63"])
def test_reference_model_decoding_equals_hf_target(reference_pair, proposer):
    model, hf, static, prompts = reference_pair
    options = {"medusa-chain-k3": {"num_speculative_tokens": 3}, "medusa-tree-63": {"tree": "gsm8k-tiny-63"}}
    heads = {}

    def proposer_for(target):
        if proposer == "plain":
            return None
        if proposer == "ngram":
            return NgramProposer(num_speculative_tokens=3)
        if "medusa" not in heads:  # load the checkpoint once; both targets share one dtype and device
            heads["medusa"] = MedusaProposer.from_options(target, path="specbench-ref/gsm8k-tiny-medusa", **options[proposer]).heads
        return MedusaProposer.from_options(target, heads=heads["medusa"], **options[proposer])

    static.verify_widths.clear()
    drafts = assert_same_decoding(hf, static, proposer_for, prompts, reserve=proposer == "ngram")
    assert (drafts > 0) == (proposer != "plain")


def test_truncate_returns_the_cache_to_an_earlier_state(reference_pair):
    """Benchmarks re-verify one draft from one cache state: after truncate the same verify gives the same logits."""
    _, _, static, prompts = reference_pair
    Decoder(static, None, GenerationConfig(max_new_tokens=8)).generate(prompts[0])  # a run first, as in bench/speed_7b
    static.prefill(0, prompts[0])  # into the cache that run sized (at least prompt + 8 entries)
    length = static.cache_length(0)
    step = [chain(prompts[1][:4])]
    first = static.verify(step).logits[0, :4].clone()
    with pytest.raises(ValueError, match=r"truncate between a verify and its commit; call commit\(\) first"):
        static.truncate({0: length})
    static.commit([[0, 1, 2]])
    assert static.cache_length(0) == length + 3
    static.truncate({0: length})  # outside inference mode, as a benchmark calls it
    assert static.cache_length(0) == length
    torch.testing.assert_close(static.verify(step).logits[0, :4], first, atol=0, rtol=0)
    static.commit([[0]])
    for bad in (0, length + 2):
        with pytest.raises(ValueError, match=rf"truncate slot 0 to {bad}: needs a committed cache of at least that "
                                             rf"many tokens \(holds {length + 1}\)"):
            static.truncate({0: bad})


# --- refusals and overflow -----------------------------------------------------------------------------


def test_unsupported_architecture_is_refused(tmp_path):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    gpt2.save_pretrained(tmp_path)
    for attempt in (lambda: StaticTarget.from_hf_model(gpt2), lambda: StaticTarget.from_pretrained(tmp_path)):
        with pytest.raises(UnsupportedModel) as error:
            attempt()
        message = str(error.value)
        assert "'gpt2'" in message and "llama, mistral, qwen2" in message and "--engine eager" in message
    yarn = LlamaConfig(**COMMON, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    with pytest.raises(UnsupportedModel, match=r"rope_type 'yarn'.*--engine eager"):
        LlamaShape.from_config(yarn)


def test_sliding_window_is_refused_unless_the_context_fits():
    with torch.random.fork_rng(devices=[]):
        mistral = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=32)).eval()
    with pytest.raises(UnsupportedModel, match=r"sliding-window attention \(32 tokens\).*max_context is 64.*--engine eager"):
        StaticTarget.from_hf_model(mistral, max_context=64)
    assert StaticTarget.from_hf_model(mistral).max_context == 32  # capped so the window never matters
    assert StaticTarget.from_hf_model(mistral, max_context=32).max_context == 32


def test_strict_weight_loading_names_keys():
    model = build("llama")
    shape = LlamaShape.from_config(model.config)
    state = dict(model.state_dict())
    state["model.layers.0.self_attn.extra.weight"] = torch.zeros(1)
    del state["model.layers.1.mlp.up_proj.weight"]
    expected = r"missing keys model\.layers\.1\.mlp\.up_proj\.weight; unexpected keys model\.layers\.0\.self_attn\.extra\.weight"
    with pytest.raises(ValueError, match=expected):
        StaticLlamaForCausalLM.from_state_dict(shape, state, dtype=torch.float32, device="cpu", source="test")
    state = dict(model.state_dict(), **{"model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(3,\), the config implies \(64,\)"):
        StaticLlamaForCausalLM.from_state_dict(shape, state, dtype=torch.float32, device="cpu", source="test")


def test_context_overflow_names_the_lengths():
    target = StaticTarget.from_hf_model(build("llama"), max_context=16)  # nothing runs before reserve() sizes it
    with pytest.raises(ValueError, match=r"^prefill before reserve\(\): size the batched cache first$"):
        target.prefill(0, random_prompt(13, 1))
    with pytest.raises(ValueError, match=r"^verify before reserve\(\): size the batched cache first$"):
        target.verify([chain(random_prompt(4, 2))])
    assert target.cache_capacity == 0 and target.cache_length(0) == 0
    with pytest.raises(ValueError, match=r"^context length exceeded: 17 tokens requested > the target's max context 16$"):
        target.reserve(17, 3)
    target.reserve(16, 3)  # the max context exactly: allowed
    with pytest.raises(ValueError, match=r"a prompt of 20 tokens does not fit a slot of 16 cache entries .*reserve\(\) "
                                         r"more room or shorten the prompt"):
        target.prefill(0, random_prompt(20, 1))
    target.prefill(0, random_prompt(13, 1))
    expected = (r"context length exceeded in slot 0: 13 cached tokens \+ a chain step of 4 nodes \(padded to its fixed "
                r"width 4\) = 17 > the slot's 16 cache entries")
    with pytest.raises(ValueError, match=expected):
        target.verify([chain(random_prompt(4, 2))])
    with pytest.raises(ValueError, match=r"a chain step of 3 nodes \(padded to its fixed width 4\) = 17 > "):
        target.verify([chain(random_prompt(3, 2))])  # 13 + 3 fits, but a chain step is written at its width
    target.verify([chain(random_prompt(1, 2))])  # a plain step: 13 + 1 <= 16
    with pytest.raises(ValueError, match=r"^context length exceeded: prompt 0 \(10 tokens\) \+ max_new_tokens \(8\)"):
        Decoder(target, None, GenerationConfig(max_new_tokens=8)).generate(random_prompt(10, 1))


# --- selection through the harness ------------------------------------------------------------------


def test_engine_key_selects_the_static_target_and_decodes_as_eager():
    """A case's ``engine`` picks the Target; both engines give the same tokens and counters per request,
    and the result records which engine ran."""
    from specbench.cases import Case
    from specbench.run.harness import load_target, run_case

    base = {"name": "chain", "suite": "t", "target": "specbench-ref/gsm8k-tiny", "max_new_tokens": 12,
            "proposer": {"name": "medusa", "path": "specbench-ref/gsm8k-tiny-medusa", "num_speculative_tokens": 3},
            "prompts": {"name": "gsm8k-embedded", "num_prompts": 2}}
    eager = run_case(Case.from_dict({**base, "engine": "eager"}), progress=False).to_dict()
    static = run_case(Case.from_dict({**base, "engine": "static"}), progress=False).to_dict()
    assert isinstance(load_target(Case.from_dict({**base, "engine": "static"}))[0], StaticTarget)
    assert (eager["details"]["engine"]["name"], static["details"]["engine"]["name"]) == ("eager", "static")
    assert static["case"]["engine"] == "static"
    fields = ("output_token_ids", "plain_output_token_ids", "num_drafts", "num_accepted_tokens", "accepted_per_position")
    for want, got in zip(eager["requests"], static["requests"]):
        assert {k: got[k] for k in fields} == {k: want[k] for k in fields}
    with pytest.raises(ValueError, match=r"engine must be one of eager, static, vllm, found 'fast'"):
        Case.from_dict({**base, "engine": "fast"})


def test_fused_projections_keep_the_checkpoint_names_and_values(pair):
    """q/k/v and gate/up run as one matmul each, yet the state dict keeps transformers' names and values
    (the named weights are views into the fused ones, so no weight is held twice)."""
    _, model, _, static = pair
    want, got = model.state_dict(), static.module.state_dict()
    for name in ("model.layers.1.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight"):
        assert torch.equal(got[name], want[name])
    attention = static.module.model.layers[1].self_attn
    assert attention.k_proj.weight.data_ptr() == attention.qkv.weight[attention.q_proj.weight.shape[0]:].data_ptr()
