"""Error messages that send a user the right way: offline advice only about variables that are set, a Medusa load
of EAGLE weights that names every Medusa layout and suggests the EAGLE proposers, and an unknown proposer option
in a case file that names the file and the case."""

from __future__ import annotations

import pytest

from specbench.cases import load_suite, with_overrides
from specbench.checkpoints.medusa import read_medusa_checkpoint
from specbench.checkpoints.medusa_config import MedusaCheckpointError
from specbench.prompts import DatasetUnavailable, load_prompts, sources
from specbench.references import DATA_DIR_ENV, resolve_reference
from specbench.run.parts import build_proposer


def test_offline_advice_names_only_the_variables_that_are_set(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sources, "hub_unreachable_reason", lambda endpoint: "hub unreachable (no network here)")
    with pytest.raises(DatasetUnavailable) as error:
        load_prompts("gsm8k")
    message = str(error.value)
    assert "hub unreachable (no network here)" in message
    assert "HF_HUB_OFFLINE" not in message  # never set: unsetting it would change nothing
    assert message.endswith("or reach the hub (a network connection, HTTPS_PROXY, or HF_ENDPOINT for a mirror).")


def test_offline_advice_names_the_variable_that_is_set(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    if sources.datasets is not None:
        monkeypatch.setattr(sources.datasets.config, "HF_HUB_OFFLINE", False)  # as if set after import: no cache
    with pytest.raises(DatasetUnavailable) as error:
        load_prompts("gsm8k")
    assert str(error.value).endswith("or allow hub access (unset HF_DATASETS_OFFLINE).")


@pytest.mark.parametrize(("reference", "advice"), [
    ("specbench-ref/gsm8k-tiny-eagle", "use --proposer eagle"),
    ("specbench-ref/gsm8k-tiny-eagle3", "use --proposer eagle3"),
])
def test_medusa_on_eagle_weights_names_every_layout_and_the_right_proposer(reference, advice):
    with pytest.raises(MedusaCheckpointError) as error:
        read_medusa_checkpoint(resolve_reference(reference))
    message = str(error.value)
    assert "FasterDecoding's medusa_lm_head.safetensors|.pt" in message  # the old layout, listed with the others
    assert "vLLM's" in message and "Medusa-2's" in message
    assert advice in message


def test_an_unknown_proposer_option_names_the_case_file_and_the_case(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[case]]\nname = "bad-opt"\n'
                    'proposer = { name = "ngram", num_speculative_tokens = 2, bogus_option = 3 }\n')
    (case,) = load_suite(str(path))
    with pytest.raises(ValueError) as error:
        build_proposer(case, target=None)  # refused before the target is used
    assert str(error.value).startswith(f"{path}: case 'bad-opt': proposer 'ngram' does not take option(s) "
                                       "'bogus_option'")
    overridden, _ = with_overrides(case, {"max_new_tokens": 8})
    with pytest.raises(ValueError, match=f"^{path}: case 'bad-opt\\[max_new_tokens=8\\]'"):
        build_proposer(overridden, target=None)  # an overridden case is still traced to its file
