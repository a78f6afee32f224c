"""EAGLE-1/2 and EAGLE-3 self-distillation training, its data, the shipped heads and the zoo stage (docs/zoo.md#eagle-heads)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specbench.eagle.checkpoint import load_eagle_head, save_eagle_head
from specbench.eagle.checkpoint3 import load_eagle3_head, save_eagle3_head
from specbench.eagle.draft_head import EagleHead
from specbench.eagle.eagle3 import Eagle3Config, eagle3_aux_layers
from specbench.eagle.training import (
    EagleTrainSettings, UnrolledAttention, eagle_loss, eagle_step, step_inputs, train_eagle_head,
)
from specbench.eagle.training_data import generate_features, make_batch
from specbench.eagle.training3 import (
    draft_logits, eagle3_loss, eagle3_step, new_eagle3_head, select_draft_vocab, token_counts, train_eagle3_head,
)
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.proposers import create_proposer
from specbench.references import DATA_DIR_ENV
from specbench.zoo import build_record, eagle_stage
from specbench.zoo.build_record import RECORD_KEYS, read_record, write_record

VOCAB, HIDDEN, LAYERS, EOS, PAD = 96, 32, 4, 0, 1
ATOL = 1e-4  # fp32, summation order only; a wrong position, mask or feature moves outputs by O(0.1)
SETTINGS = EagleTrainSettings(steps=40, batch_size=4, lr=3e-3, warmup_steps=2, noise=0.0)
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
MODES = {"chain": dict(num_speculative_tokens=3), "static-tree": dict(tree=TREE),
         "dynamic-tree": dict(top_k=3, depth=3, total_tokens=8)}


def tiny_target(seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2,
                         eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # confident like a trained model: a random one's near-uniform distributions bound every
        model.lm_head.weight.mul_(6.0)  # cross-entropy from below by their entropy (greedy outputs are unchanged)
    return model


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (int(torch.randint(4, 9, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(count)]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def data(target):
    return generate_features(target, prompts(4), 12, aux_layers=eagle3_aux_layers(LAYERS), batch_size=4)


def fresh_head(target, seed: int = 1) -> EagleHead:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return EagleHead(eagle_stage.head_config(target), with_embed=False)


def fresh_head3(target, data, draft_vocab: int = 48):
    d2t, t2d = select_draft_vocab(token_counts(data, VOCAB), draft_vocab)
    config = Eagle3Config.from_eagle(eagle_stage.head_config(target), draft_vocab)
    return new_eagle3_head(config, d2t, t2d, target_lm_head=target.lm_head.weight.detach(),
                           target_norm=target.model.norm.weight.detach(), seed=2)


# ---------------------------------------------------------------- the data are what the engine sees


def test_distillation_data_are_the_greedy_outputs_and_the_features_the_engine_reads(target, data):
    config = GenerationConfig(max_new_tokens=12, eos_token_ids=(EOS,))
    aux_layers = eagle3_aux_layers(LAYERS)
    for prompt, tokens, final, aux, start in zip(prompts(4), data.token_ids, data.final, data.aux, data.starts):
        assert start == len(prompt) - 1 and tokens[: len(prompt)].tolist() == prompt
        plain = Decoder(HFTarget(target), None, config).generate(torch.tensor(prompt)).output_token_ids
        assert tokens[len(prompt):].tolist() == plain  # the target's own greedy continuation, through EOS
        with torch.no_grad():  # one full forward, as HFTarget.prefill computes features
            out = target.get_decoder()(input_ids=tokens[None, :-1], output_hidden_states=True)
        torch.testing.assert_close(final[:-1], out.last_hidden_state[0], atol=ATOL, rtol=0)
        want_aux = torch.cat([out.hidden_states[i][0] for i in aux_layers], dim=-1)  # (T - 1, 3H)
        torch.testing.assert_close(aux[:-1], want_aux, atol=ATOL, rtol=0)
        assert not final[-1].any()  # the last token's feature is never computed, nor read


# ---------------------------------------------------------------- the training forward is the drafting forward


def _unrolled(head, step_fn, batch, embedding, first_features, steps: int, keep=None) -> list[torch.Tensor]:
    """Outputs (B, A, H) of each unroll step (from step 1 on only the columns ``keep``), chained as eagle_loss and
    eagle3_loss chain them."""
    attention = UnrolledAttention(_attn(head), head.inv_freq, batch)
    embeds, features, outs = embedding(batch.ids[:, 1:]), first_features, []
    for step in range(steps):
        if step:  # depth j: token i + 1 + j, the parent's output
            if step == 1 and keep is not None:
                attention.narrow(keep)
                outs[-1] = outs[-1][:, keep]
            embeds, features = step_inputs(batch, embedding, step, keep)[0], outs[-1]
        outs.append(step_fn(head, attention, embeds, features))
    return outs


def _attn(head):
    return head.layers[0].self_attn if hasattr(head, "layers") else head.midlayer.self_attn


def _drafted(head, embedding, tokens, features, root: int, depth_tokens: list[int]) -> list[torch.Tensor]:
    """The drafting forward: catch up positions 0..root with the target's features, then a chain of nodes at
    positions root + 1, ..., each reading its token and its parent's output."""
    cache = head.new_cache()
    out = head(embedding(tokens[1: root + 2]), features[: root + 1], torch.arange(root + 1), cache)[-1]
    outs = [out]
    for depth, token in enumerate(depth_tokens, start=1):
        sees = torch.ones(1, depth, dtype=torch.bool)
        out = head(embedding(torch.tensor([token])), out[None], torch.tensor([root + depth]), cache, visible=root + 1,
                   block_mask=sees)[0]
        outs.append(out)
    return outs


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_forward_equals_the_drafting_forward(target, data, kind):
    embedding = target.get_input_embeddings()
    head = fresh_head(target) if kind == "eagle" else fresh_head3(target, data)
    batch = make_batch(data, [0, 1, 2, 3], "cpu")  # rows of different prompt lengths: left-aligned at their starts
    with torch.no_grad():
        if kind == "eagle":
            outs = _unrolled(head, eagle_step, batch, embedding, batch.final[:, : batch.width], 3)
        else:
            outs = _unrolled(head, eagle3_step, batch, embedding, head.fc(batch.aux[:, : batch.width]), 3)
    drafting = head.prepare()  # fused weights, the proposer's forward
    for row in range(4):
        tokens, start = data.token_ids[row], data.starts[row]
        features = data.final[row] if kind == "eagle" else data.aux[row]
        for root in (start, start + 2):  # the first drafted position and a later one
            want = _drafted(drafting, embedding, tokens, features, root, tokens[root + 2: root + 4].tolist())
            column = root - start  # drafted column of root position
            for step, out in enumerate(outs):
                torch.testing.assert_close(out[row, column], want[step], atol=ATOL, rtol=0)


def test_unrolling_a_subset_of_positions_unrolls_exactly_their_chains(target, data):
    embedding, head = target.get_input_embeddings(), fresh_head3(target, data)
    batch = make_batch(data, [0, 1, 2, 3], "cpu")
    keep = torch.tensor([0, 3, 5, 9])  # unroll_fraction < 1: a subset of drafted columns beyond step 0
    with torch.no_grad():
        full = _unrolled(head, eagle3_step, batch, embedding, head.fc(batch.aux[:, : batch.width]), 3)
        part = _unrolled(head, eagle3_step, batch, embedding, head.fc(batch.aux[:, : batch.width]), 3, keep=keep)
    for step in (0, 1, 2):  # step 0 runs every column (the context); part[0] is narrowed to feed step 1
        torch.testing.assert_close(part[step], full[step][:, keep], atol=ATOL, rtol=0)


# ---------------------------------------------------------------- training lowers the loss


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_lowers_the_loss_on_a_fixed_batch(target, data, kind):
    embedding, lm_head = target.get_input_embeddings(), target.lm_head
    settings = SETTINGS if kind == "eagle" else SETTINGS.__class__(**{**SETTINGS.__dict__, "unroll": 2})
    head = fresh_head(target) if kind == "eagle" else fresh_head3(target, data)
    loss_fn = eagle_loss if kind == "eagle" else eagle3_loss
    batch = make_batch(data, [0, 1, 2, 3], "cpu")
    with torch.no_grad():
        before, _ = loss_fn(head, embedding, lm_head, batch, settings)
    train = train_eagle_head if kind == "eagle" else train_eagle3_head
    history = train(head, data, embedding, lm_head, settings, progress=False)  # batch = all 4 sequences: the fixed batch
    with torch.no_grad():
        after, _ = loss_fn(head, embedding, lm_head, batch, settings)
    assert len(history) == settings.steps
    # 4 sequences x 12 trained positions against ~30k head parameters: 40 full-batch AdamW steps memorise them.
    # Measured on tiny targets of seeds 0-3: the loss ends at 0.16-0.23 (EAGLE-1) and 0.05-0.07 (EAGLE-3) of where
    # it started; a broken gradient path (a detached feature, a frozen layer, a wrong label shift) stays far above
    # half, so half is the bound, with margin either way
    assert after.item() < 0.5 * before.item(), (before.item(), after.item())


# ---------------------------------------------------------------- published layout, strict loaders, lossless


@pytest.fixture(scope="module")
def saved_heads(tmp_path_factory, target, data):
    out = tmp_path_factory.mktemp("heads")
    embedding, lm_head = target.get_input_embeddings(), target.lm_head
    head, head3 = fresh_head(target), fresh_head3(target, data)
    train_eagle_head(head, data, embedding, lm_head, EagleTrainSettings(steps=6, batch_size=4, lr=3e-3, warmup_steps=1),
                     progress=False)
    train_eagle3_head(head3, data, embedding, lm_head, EagleTrainSettings(steps=6, batch_size=4, lr=3e-3, warmup_steps=1,
                                                                           noise=0.0, unroll=2), progress=False)
    save_eagle_head(out / "eagle", head.to(torch.bfloat16), format="safetensors", with_embed=False)
    save_eagle3_head(out / "eagle3", head3.to(torch.bfloat16), format="safetensors")
    return out


def test_trained_heads_load_through_the_strict_loaders(saved_heads):
    sizes = dict(target_hidden_size=HIDDEN, target_vocab_size=VOCAB, dtype=torch.float32)
    head = load_eagle_head(saved_heads / "eagle", **sizes)
    assert head.embed_tokens is None and head.config.num_attention_heads == 4  # the target's embedding serves
    head3 = load_eagle3_head(saved_heads / "eagle3", **sizes)
    assert head3.config.draft_vocab_size == 48 and int(head3.t2d.sum()) == 48


@pytest.mark.parametrize(("name", "mode"), [("eagle", m) for m in MODES] + [("eagle3", "chain"), ("eagle3", "dynamic-tree")])
def test_trained_heads_decode_losslessly(target, saved_heads, name, mode):
    config = GenerationConfig(max_new_tokens=16, eos_token_ids=(EOS,))
    checked = 0
    for prompt in prompts(3, seed=5):
        truth = Decoder(HFTarget(target), None, config).generate(torch.tensor(prompt)).output_token_ids
        hf = HFTarget(target)
        proposer = create_proposer(name, hf, path=str(saved_heads / name), **MODES[mode])
        result = Decoder(hf, proposer, config).generate(torch.tensor(prompt))
        assert result.output_token_ids == truth
        checked += result.counters.num_drafts
    assert checked > 0


# ---------------------------------------------------------------- EAGLE-3's draft vocabulary


def test_draft_vocabulary_is_the_most_frequent_tokens_with_consistent_maps():
    counts = torch.zeros(20, dtype=torch.long)
    counts[[3, 7, 11, 15, 19]] = torch.tensor([5, 9, 9, 2, 7])
    d2t, t2d = select_draft_vocab(counts, 4)
    chosen = torch.arange(4) + d2t  # target id of each draft id
    assert chosen.tolist() == [3, 7, 11, 19]  # the four most frequent, ascending; 15 (2) is left out
    assert bool(((chosen >= 0) & (chosen < 20)).all()) and d2t.dtype == torch.long
    assert t2d.dtype == torch.bool and t2d.nonzero().flatten().tolist() == chosen.tolist()
    ties, _ = select_draft_vocab(torch.zeros(6, dtype=torch.long), 3)
    assert (torch.arange(3) + ties).tolist() == [0, 1, 2]  # equal counts: the lower ids
    with pytest.raises(ValueError, match="draft_vocab_size 21 must be between 1 and the target's vocab_size 20"):
        select_draft_vocab(counts, 21)


def test_eagle3_head_starts_from_the_targets_rows(target, data):
    head = fresh_head3(target, data)
    ids = head.draft_to_target()
    torch.testing.assert_close(head.lm_head.weight, target.lm_head.weight[ids])
    hidden = torch.randn(5, HIDDEN)
    want = target.lm_head(target.model.norm(hidden))[:, ids]  # the target's own scores of the draft ids
    torch.testing.assert_close(draft_logits(head, hidden), want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------- the zoo stage: all of it or nothing


STAGE = dataclasses.replace(eagle_stage.TEST, draft_vocab_size=48)  # the zoo's test scale, for a 96-token target


def _fake_build(root: Path, target) -> Path:
    """A finished build's shape at a tiny scale: target/ (the tiny target), medusa/, draft/, trees/, a record."""
    from specbench.medusa.tree_calibration import save_tree_json

    build = root / "gsm8k-tiny"
    target.save_pretrained(build / "target")
    for part in ("medusa", "draft"):
        (build / part).mkdir()
        (build / part / "weights.bin").write_bytes(part.encode() * 100)
    save_tree_json(TREE, build / "trees" / "gsm8k-tiny-63.json")
    record = {key: {} for key in RECORD_KEYS}
    record.update(schema=1, name="gsm8k-tiny", status="complete", scale="test", seed=0, device="cpu", passed=True,
                  checks={}, wall_time_s={"total": 1.0})
    write_record(build, record)
    return build


def _digests(build: Path) -> dict[str, str]:
    return {str(p.relative_to(build)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(build.rglob("*")) if p.is_file()}


@pytest.fixture
def stage_build(tmp_path, monkeypatch, target):
    build = _fake_build(tmp_path, target)
    inputs = eagle_stage.StageInputs(
        model=target, question_prompts=prompts(8, seed=1), answer_prefix_prompts=prompts(4, seed=2),
        heldout_prompts=prompts(2, seed=3), eval_prompts=prompts(2, seed=4), tree=build / "trees" / "gsm8k-tiny-63.json",
        weights_dtype="bfloat16", max_new_tokens=8, eval_max_new_tokens=8)
    monkeypatch.setattr(eagle_stage, "stage_inputs_for_build", lambda *args: inputs)  # no tokenizer, no GSM8K needed
    return build


def test_stage_commits_heads_and_record_sections(stage_build):
    before = _digests(stage_build)
    build, record = eagle_stage.add_eagle_heads(stage_build, STAGE, progress=False)
    assert sorted(p.name for p in build.iterdir()) == ["build_record.json", "draft", "eagle", "eagle3", "medusa", "target", "trees"]
    after = _digests(build)
    assert {k: v for k, v in after.items() if k in before and k != "build_record.json"} == {
        k: v for k, v in before.items() if k != "build_record.json"}  # target/medusa/draft/trees byte-identical
    section = record["eagle"]
    assert read_record(build)["checks"] == record["checks"] and read_record(build)["eagle"]["data"] == section["data"]
    assert record["passed"]
    assert set(section["acceptance"]) >= {"plain", "eagle_chain_k3", "eagle1_tree_63", "eagle2_dynamic",
                                          "eagle3_chain_k3", "eagle3_dynamic"}
    assert all(v["outputs_match_plain"] for k, v in section["acceptance"].items() if k.startswith("eagle"))
    assert record["sizes_bytes"]["eagle"] == section["sizes_bytes"]["eagle"] > 0
    assert record["sizes_bytes"]["total"] == sum(v for k, v in record["sizes_bytes"].items() if k != "total")
    assert section["eagle3"]["draft_vocab_size"] == STAGE.draft_vocab_size
    metrics = record["reproducibility"]["metrics"]  # the fake record predates them: compare_records' defaults kept
    assert metrics == [*build_record.REPRODUCED_METRICS, *eagle_stage.EAGLE_REPRODUCED_METRICS]
    with pytest.raises(eagle_stage.EagleHeadsExist, match="pass --overwrite"):
        eagle_stage.add_eagle_heads(stage_build, STAGE, progress=False)


@pytest.mark.parametrize("where", ["training", "commit"])
def test_a_failure_midway_leaves_the_build_as_it_was(stage_build, monkeypatch, where):
    before = _digests(stage_build)

    def fail(*args, **kwargs):
        raise RuntimeError(f"injected failure in {where}")

    if where == "training":  # after eagle/ is written, before eagle3/
        monkeypatch.setattr(eagle_stage, "train_eagle3_dir", fail)
    else:  # the record write, after both directories were renamed into the build
        monkeypatch.setattr(build_record, "write_record", fail)
    with pytest.raises(RuntimeError, match="injected failure"):
        eagle_stage.add_eagle_heads(stage_build, STAGE, progress=False)
    assert _digests(stage_build) == before  # no eagle/, no eagle3/, no staging directory, the same record
    assert sorted(p.name for p in stage_build.iterdir()) == ["build_record.json", "draft", "medusa", "target", "trees"]


DATA_DIR = os.environ.get(DATA_DIR_ENV)


@pytest.mark.skipif(not DATA_DIR or not (Path(DATA_DIR) / "gsm8k" / "train.jsonl").is_file(),
                    reason=f"{DATA_DIR_ENV} is unset or lacks gsm8k/train.jsonl and test.jsonl")
def test_the_stage_on_a_build_regenerates_exactly_the_builds_heads(tmp_path):
    """`specbench zoo eagle` on a finished build (its prompts rebuilt from the record) trains the very heads the
    build's own pipeline trained: CPU training is deterministic, so the weights are bit-identical."""
    from specbench.zoo.build import build_zoo
    from specbench.zoo.config import TEST

    built = build_zoo(tmp_path, TEST, scale="test", data_dir=DATA_DIR, device="cpu", progress=False)
    shipped = {name: (built / name / "model.safetensors").read_bytes() for name in eagle_stage.HEAD_DIRS}
    others = _digests(built)
    _, record = eagle_stage.add_eagle_heads(built, data_dir=DATA_DIR, overwrite=True, progress=False)
    for name, weights in shipped.items():
        assert (built / name / "model.safetensors").read_bytes() == weights, name
    untouched = lambda digests: {k: v for k, v in digests.items() if k.split("/")[0] in ("target", "medusa", "draft", "trees")}  # noqa: E731
    assert untouched(_digests(built)) == untouched(others) and len(untouched(others)) > 5
    assert record["eagle"]["base_sha256"] == {"target/" + p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                              for p in sorted((built / "target").iterdir())}
