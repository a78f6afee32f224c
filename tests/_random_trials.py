"""Random exactness trials: a seed draws a whole case (architecture, proposer and its settings, prompts of mixed
lengths, max_new_tokens, an EOS some requests reach, the batch size; greedy, or sampled with each request's own seed)
and decodes it twice, every request alone on
the eager reference target and all of them through the static engine's slots; the two must agree token for token,
counter for counter and in finish reason. The hand-picked cases of test_batched_engine.py and test_batched_eagle.py
fix one draw each; these cover their combinations."""

from __future__ import annotations

import random

import torch

from _prompts import random_prompt, repetitive_prompt
from test_batched_engine import random_heads, tiny_llama_model
from test_batched_graphs import FakeCapture as TargetCapture
from test_eagle_graphs import FakeCapture as EagleCapture
from test_eagle import random_head
from test_eagle3 import deep_llama, random_head3
from test_static_target import CONFIGS, build
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.engine.proposer import for_batch
from specbench.engine.sampling import SamplingParams
from specbench.engine.static_target import StaticTarget
from specbench.proposers.draft_model import DraftModelProposer
from specbench.proposers.eagle import EagleProposer
from specbench.proposers.eagle3 import Eagle3Proposer
from specbench.proposers.medusa import MedusaProposer
from specbench.proposers.ngram import NgramProposer

# fp32 logits of the two targets differ by accumulation order, ~1e-6 (test_static_target.LOGITS_ATOL): a case whose
# reference top two logits are closer than this where the two decodes part is a tie, with no exact answer
TIE = 1e-4
KINDS = ("plain", "ngram", "medusa-chain", "medusa-tree", "draft", "eagle-chain", "eagle-tree", "eagle-dynamic",
         "eagle3-chain", "eagle3-dynamic")


def random_tree(rng: random.Random, max_nodes: int, depth: int) -> list[list[int]]:
    """A tree of at most ``max_nodes`` nodes and ``depth`` levels, in Medusa's path notation, breadth first."""
    tree, frontier = [], [[]]
    while frontier and len(tree) < max_nodes:
        parent = frontier.pop(0)
        for child in range(rng.randint(1, 3)):
            node = parent + [child]
            if len(node) <= depth and len(tree) < max_nodes:
                tree.append(node)
                frontier.append(node)
    return tree


def draw(seed: int) -> dict:
    """The case seed ``seed`` draws (plain data: what a failure prints)."""
    rng = random.Random(seed)
    kind = rng.choice(KINDS)
    top_k, depth = rng.randint(1, 4), rng.randint(1, 5)
    prompts = [("repetitive", rng.randint(0, 999)) if rng.random() < 0.5 else
               ("random", rng.randint(1, 30), rng.randint(0, 999)) for _ in range(rng.randint(1, 6))]
    case = dict(
        seed=seed, kind=kind, architecture=rng.choice(sorted(CONFIGS)), k=rng.randint(1, 5),
        tree=random_tree(rng, rng.randint(1, 12), 4), top_k=top_k, depth=depth,
        total_tokens=rng.randint(1, min(16, top_k + (depth - 1) * top_k ** 2)), head_seed=rng.randint(1, 50),
        prompts=prompts, max_new_tokens=rng.randint(1, 24), eos=rng.random() < 0.7, eos_pick=rng.random(),
        ignore_eos=rng.random() < 0.15, batch_size=rng.randint(1, len(prompts) + 1),
    )
    # drawn last, so adding it left every greedy case of an earlier seed as it was
    case["sampling"] = None if rng.random() < 0.7 else dict(
        temperature=rng.choice((0.7, 1.0)), top_p=rng.choice((1.0, 0.9)), acceptance=rng.choice(("auto", "typical")))
    case["draft_temperature"] = rng.choice((0.0, 0.0, 0.8))  # a draft model's own sampling: its draft probabilities
    case["queue_ahead"] = rng.random() < 0.75  # the GPU's steps queued ahead of their reads, forced on the CPU
    case["graphs"] = rng.random() < 0.5  # the GPU's captured steps, replayed on the CPU as recorded (tests/_op_tape.py)
    return case


def queues_ahead(case: dict) -> bool:
    """Whether the case's static decode queues its steps ahead: asked to, greedy, and a proposer that can (n-gram
    drafts on the host; a draft model only greedily)."""
    proposer_can = case["kind"] != "ngram" and (case["kind"] != "draft" or case["draft_temperature"] == 0)
    return case["queue_ahead"] and case["sampling"] is None and proposer_can


def _proposer_maker(case: dict):
    """(the target model, a function building the case's proposer for a target; ``graphs=True``: its own steps
    captured through the CPU's stand-in for CUDA graphs, for a target that captures its)."""
    kind, k = case["kind"], case["k"]
    if kind.startswith("eagle3"):
        head = random_head3(seed=case["head_seed"], draft_vocab=96)
        model, cls = deep_llama(), Eagle3Proposer
    elif kind.startswith("eagle"):
        head = random_head(seed=case["head_seed"], with_embed=False)
        model, cls = build(case["architecture"], seed=case["seed"]), EagleProposer
    else:
        architecture = case["architecture"]
        model = tiny_llama_model(seed=case["seed"]) if kind == "draft" else build(architecture, seed=case["seed"])
    if kind.startswith("eagle"):
        options = ({"num_speculative_tokens": k} if kind.endswith("chain") else {"tree": case["tree"]}
                   if kind.endswith("tree") else {n: case[n] for n in ("top_k", "depth", "total_tokens")})
        return model, lambda target, graphs=False: cls.from_options(
            target, head=head, **options, **({"graph_backend": EagleCapture()} if graphs else {}))
    if kind.startswith("medusa"):
        heads = random_heads(seed=case["head_seed"])
        options = {"num_speculative_tokens": min(k, 4)} if kind == "medusa-chain" else {"tree": case["tree"]}
        return model, lambda target, graphs=False: MedusaProposer.from_options(target, heads=heads, **options)
    if kind == "draft":
        draft = StaticTarget.from_hf_model(tiny_llama_model(seed=case["seed"] + 1))
        return model, lambda target, graphs=False: DraftModelProposer.from_options(
            target, draft=StaticTarget(draft.module, draft.config, target.batch_size if graphs else 1,
                                       graph_backend=TargetCapture() if graphs else None),
            num_speculative_tokens=k, temperature=case["draft_temperature"], seed=case["seed"])
    if kind == "ngram":
        return model, lambda target, graphs=False: NgramProposer(num_speculative_tokens=k)
    return model, lambda target, graphs=False: None


def _tie(model, prompt, want: list[int], got: list[int]) -> bool:
    """Whether the two outputs part at a token whose reference logits tie: the top two within TIE, got's among them."""
    part = next(i for i, (a, b) in enumerate(zip(want, got)) if a != b)
    context = torch.cat([prompt, torch.tensor(want[:part], dtype=prompt.dtype)])[None]  # (1, T + part)
    with torch.inference_mode():
        top = model(context).logits[0, -1].float().topk(2)  # the whole sequence, no cache
    return float(top.values[0] - top.values[1]) < TIE and got[part] in top.indices.tolist()


def run_trial(seed: int, compile: bool = False, observed: list | None = None) -> str | None:
    """None when the static engine agrees with the eager reference on seed's case, "tie" when they part only at a
    tie of the reference's logits (no exact answer there), else what differed; ``observed`` gets whether the static
    decode queued its steps ahead, and how many step graphs it replayed."""
    case = draw(seed)
    model, make = _proposer_maker(case)
    prompts = [repetitive_prompt(p[1]) if p[0] == "repetitive" else random_prompt(p[1], p[2]) for p in case["prompts"]]
    eager, static = HFTarget(model), StaticTarget.from_hf_model(model, compile=compile)
    plain = GenerationConfig(max_new_tokens=case["max_new_tokens"], ignore_eos=True)
    emitted = [t for p in prompts for t in Decoder(eager, None, plain).generate(p).output_token_ids[1:]]
    eos = (emitted[int(case["eos_pick"] * len(emitted))],) if case["eos"] and emitted else ()
    sampling = SamplingParams(**case["sampling"]) if case["sampling"] else SamplingParams()
    config = GenerationConfig(max_new_tokens=case["max_new_tokens"], eos_token_ids=eos, ignore_eos=case["ignore_eos"],
                              sampling=sampling)
    seeds = [seed * 8 + i for i in range(len(prompts))]  # sampled: request i draws from its own seed, alone or not
    alone = [Decoder(eager, make(eager), config).generate(p, seed=s) for p, s in zip(prompts, seeds)]
    batch_size, factory = case["batch_size"], (lambda: make(static)) if case["kind"] == "ngram" else None
    # every step captured once and replayed with the capture's Python decisions, as on a GPU; not with compiled stages,
    # whose kernels the CPU's stand-in cannot record (it replays aten ops)
    graphs = case["graphs"] and not compile
    if graphs:
        target = StaticTarget(static.module, static.config, batch_size, max_context=static.max_context, ops=static.ops,
                              graph_backend=TargetCapture())
        proposer = for_batch(make(target, graphs=True), batch_size, factory=factory)
    else:  # the proposer first: an EAGLE-3 head asks its target for aux layers, which with_batch_size carries over
        proposer = for_batch(make(static), batch_size, factory=factory)
        target = static.with_batch_size(batch_size)
    decoder = Decoder(target, proposer, config)
    decoder.queue_ahead = case["queue_ahead"]  # as on a GPU (the CPU's ops run as they are called: read one by one)
    batched = decoder.generate_all(prompts, seeds)
    if observed is not None:
        observed += [decoder._ahead, sum(target.graphs.replays.values())]
    for index, (got, want) in enumerate(zip(batched, alone)):
        if (got.output_token_ids, got.counters, got.finish_reason) != (want.output_token_ids, want.counters,
                                                                       want.finish_reason):
            if sampling.is_greedy and got.output_token_ids != want.output_token_ids and _tie(
                    model, prompts[index], want.output_token_ids, got.output_token_ids):
                return "tie"
            return (f"{case} eos {eos}: request {index} got {got.output_token_ids} {got.counters} {got.finish_reason}, "
                    f"alone {want.output_token_ids} {want.counters} {want.finish_reason}")
    return None
