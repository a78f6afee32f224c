"""`specbench calibrate-tree` on the shipped reference checkpoint, and `specbench zoo synth --tiny`
writing the upstream Medusa layout that the normal checkpoint path then loads."""

from __future__ import annotations

import json

import pytest

from specbench.cli import main


def test_calibrate_tree_for_the_reference_heads(tmp_path, capsys):
    out = tmp_path / "tree.json"
    code = main([
        "calibrate-tree", "--target", "specbench-ref/gsm8k-tiny", "--medusa", "specbench-ref/gsm8k-tiny-medusa",
        "--prompts", "gsm8k-embedded", "--num-prompts", "6", "--max-new-tokens", "32", "--nodes", "15",
        "--output", str(out), "-q",
    ])
    assert code == 0
    saved = json.loads(out.read_text())
    assert len(saved["paths"]) == 15
    top1 = saved["metadata"]["top1_accuracy"]
    # trained heads: the first head is right far more often than a random one (1/2048), and the
    # first head, predicting the nearest token, is the most accurate
    assert top1[0] > 0.2 and top1[0] == max(top1)
    # a 15-node tree adds at least the first head's top-1 accuracy to the MAL of 1
    assert saved["metadata"]["expected_mean_acceptance_length"] > 1 + top1[0]
    from specbench.medusa.trees import load_tree

    assert load_tree(str(out)).num_nodes == 15


def test_zoo_synth_writes_the_upstream_layout(tmp_path):
    import warnings

    from specbench.checkpoints.medusa import MedusaCheckpointWarning, read_medusa_checkpoint
    from specbench.medusa.checkpoint import load_medusa_heads

    assert main(["zoo", "synth", str(tmp_path), "--tiny", "--device", "cpu"]) == 0
    config = json.loads((tmp_path / "medusa" / "config.json").read_text())
    assert config["medusa_num_heads"] == 2 and "model_type" not in config  # as published: wrong and untyped
    assert (tmp_path / "medusa" / "medusa_lm_head.pt").is_file()
    with pytest.warns(MedusaCheckpointWarning, match="medusa_num_heads = 2 but .* holds 5"):
        checkpoint = read_medusa_checkpoint(tmp_path / "medusa")
    assert checkpoint.layout == "fasterdecoding" and checkpoint.config.num_heads == 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MedusaCheckpointWarning)
        heads = load_medusa_heads(tmp_path / "medusa", hidden_size=64, vocab_size=512)
    assert all(bool(block[0].linear.bias.abs().sum() > 0) for block in heads.blocks)  # biases kept


def test_synthetic_target_is_decisive_so_bf16_verification_keeps_the_greedy_text(tmp_path):
    """Uniform random weights leave the greedy argmax on near-ties that bf16 rounding flips; the synthetic
    target walks a random successor cycle with wide margins, so an oracle of its plain greedy text is
    accepted in full under k-token bf16 verification, as it would be for a trained model."""
    import torch

    from specbench.checkpoints.resolve import load_target_model
    from specbench.engine.decode import Decoder, GenerationConfig
    from specbench.engine.hf_target import HFTarget
    from specbench.proposers.scripted import ScriptedProposer
    from specbench.zoo.synth import NUM_SPECIAL_TOKENS

    assert main(["zoo", "synth", str(tmp_path), "--tiny", "--device", "cpu"]) == 0
    model = load_target_model(str(tmp_path / "target"), dtype=torch.bfloat16, device="cpu")
    target = HFTarget(model)
    prompt = torch.tensor([5, 17, 200, 33, 101, 7])
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    plain = Decoder(target, None, config).generate(prompt).output_token_ids

    embed, head = model.get_input_embeddings().weight.float(), model.get_output_embeddings().weight.float()
    successor = (embed @ head.T).argmax(-1)  # [V]: the token each token's own embedding votes for
    assert plain == [int(successor[t]) for t in [int(prompt[-1])] + plain[:-1]]  # the cycle, token by token
    assert len(set(plain)) == len(plain) and min(plain) >= NUM_SPECIAL_TOKENS  # no repeats, never a special token

    for k in (3, 5):
        oracle = ScriptedProposer(plain + [0] * 8, k, target.vocab_size)
        result = Decoder(target, oracle, config).generate(prompt)
        assert result.output_token_ids == plain
        # every draft accepted in full: k + 1 tokens a step (the last step cut by max_new_tokens), and every
        # emitted token but each step's bonus token was a draft token
        assert result.counters.num_drafts == -(-40 // (k + 1))
        assert result.counters.num_accepted_tokens == 40 - result.counters.num_drafts
