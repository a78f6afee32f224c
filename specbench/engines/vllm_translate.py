"""A case's proposer as vLLM's ``speculative_config``: options mapped by name, checkpoints translated into the
layout vLLM loads faithfully (written to a work directory, atomically), every translation reported, and what
vLLM cannot run faithfully named as a known divergence instead of run as if equivalent (docs/conformance.md)."""

from __future__ import annotations

import json
from pathlib import Path

from specbench.cases.requirements import expand_ref
from specbench.cases import Case
from specbench.engines.interface import EngineRefused, KnownDivergence, Translation

# specbench proposer -> vLLM speculative method
METHODS = {"ngram": "ngram", "draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa"}
# per proposer: the options vLLM takes under another name (or the same), and the options that change nothing when
# left at this value; anything else is refused by name
_MAPPED = {
    "ngram": {"num_speculative_tokens": "num_speculative_tokens", "min_n": "prompt_lookup_min",
              "max_n": "prompt_lookup_max"},
    "draft": {"num_speculative_tokens": "num_speculative_tokens"},
    "eagle": {"num_speculative_tokens": "num_speculative_tokens"},
    "eagle3": {"num_speculative_tokens": "num_speculative_tokens"},
    "medusa": {"num_speculative_tokens": "num_speculative_tokens"},
}
_NEUTRAL = {"ngram": {"match": ("latest", "earliest")}, "draft": {"temperature": (0, 0.0)}}
_DEFAULTS = {"ngram": {"num_speculative_tokens": 3, "min_n": 1, "max_n": 3}, "draft": {"num_speculative_tokens": 3}}
_WHY_UNMAPPED = {
    "tree": "vLLM drafts a chain here (no static tree of top-k candidates)",
    "top_k": "vLLM drafts a chain here (no EAGLE-2 dynamic tree)",
    "depth": "vLLM drafts a chain here (no EAGLE-2 dynamic tree)",
    "total_tokens": "vLLM drafts a chain here (no EAGLE-2 dynamic tree)",
    "temperature": "vLLM's draft model drafts greedily",
    "seed": "vLLM's draft model drafts greedily, so a draft seed has no counterpart",
    "cuda_graphs": "vLLM decides its own graph capture",
    "graph_backend": "vLLM decides its own graph capture",
}
NGRAM_RULE = KnownDivergence(
    "ngram-match",
    "vLLM's n-gram proposer drafts after the earliest occurrence of the longest match, specbench's (match = "
    "\"latest\") after the most recent; counters differ wherever a context holds the match twice",
    "set match = \"earliest\" in the case's proposer table to compare the same rule")
EAGLE_BIAS = KnownDivergence(
    "eagle-bias",
    "vLLM builds the EAGLE-1 fc without a bias, so it drops fc.bias, and reads \"bias\": true as attention_bias, "
    "building q/k/v/o biases the checkpoint does not have and leaving them unset",
    "vLLM would have to build fc with bias=config.bias and stop reading \"bias\" as attention_bias")


def translate(case: Case, workdir: Path) -> Translation:
    """vLLM's speculative_config for ``case`` (None when it decodes plainly), with what was translated, written
    under ``workdir``; an option or checkpoint vLLM cannot take raises EngineRefused naming it."""
    options = dict(case.proposer)
    name = options.pop("name")
    if name == "none":
        return Translation(None)
    if name not in METHODS:
        raise EngineRefused(f"case {case.case_id}: proposer {name!r} has no vLLM counterpart; vLLM runs "
                            f"{', '.join(sorted(METHODS))} (or none)")
    path = options.pop("path", None)
    config = {"method": METHODS[name], **_mapped_options(case, name, options)}
    translation = Translation(config)
    if name == "ngram" and options.get("match", "latest") == "latest":
        translation.divergences.append(NGRAM_RULE)
    if path is not None:
        directory = _resolve(path)
        if name == "medusa":
            directory = _medusa(directory, workdir / "medusa-vllm", translation)
        elif name == "eagle":
            _eagle(directory, translation)
        config["model"] = str(directory)
    return translation


def _mapped_options(case: Case, name: str, options: dict) -> dict:
    """The proposer's options under vLLM's names; one that has no counterpart is refused by name."""
    mapped, neutral = dict(_DEFAULTS.get(name, {})), _NEUTRAL.get(name, {})
    mapped = {_MAPPED[name][key]: value for key, value in mapped.items()}
    for key, value in options.items():
        if key in _MAPPED[name]:
            mapped[_MAPPED[name][key]] = value
        elif key in neutral and value in neutral[key]:
            continue
        else:
            why = _WHY_UNMAPPED.get(key, "vLLM has no such setting")
            raise EngineRefused(f"case {case.case_id}: proposer option {key} = {value!r} ({name}) cannot be mapped "
                                f"to vLLM: {why}; remove it from the proposer table to run on vLLM")
    if name == "medusa" and "num_speculative_tokens" not in mapped:
        raise EngineRefused(f"case {case.case_id}: a Medusa case on vLLM needs num_speculative_tokens (vLLM drafts "
                            "the top-1 chain of the first K heads)")
    return mapped


def _resolve(path: str) -> Path:
    from specbench.checkpoints.resolve import resolve_model_dir

    return resolve_model_dir(expand_ref(path, key="proposer.path"))


def _medusa(directory: Path, out_dir: Path, translation: Translation) -> Path:
    """Medusa heads in vLLM's layout: the sizes and head count the weights show, medusa_fc_bias when the blocks
    have biases, safetensors; the checkpoint itself when it already says all of that."""
    from specbench.checkpoints.medusa import read_medusa_checkpoint, write_medusa_checkpoint

    checkpoint = read_medusa_checkpoint(directory)
    heads = checkpoint.config
    if not heads.has_vocab_projection:
        raise EngineRefused(f"{checkpoint.weights_file}: version-2 Medusa heads (no per-head lm_head) have no vLLM "
                            "layout: vLLM's Medusa needs one vocab projection per head")
    raw = json.loads(checkpoint.config_file.read_text(encoding="utf-8")) if checkpoint.config_file else {}
    needed = {"hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size, "num_heads": heads.num_heads,
              "medusa_fc_bias": True}
    claimed = {"hidden_size": raw.get("hidden_size"), "vocab_size": raw.get("vocab_size"),
               "num_heads": raw.get("num_heads", raw.get("medusa_num_heads")),
               "medusa_fc_bias": raw.get("medusa_fc_bias")}
    defaults = {"hidden_size": 4096, "vocab_size": 32001, "num_heads": 5, "medusa_fc_bias": False}  # vLLM's
    changes = {key: value for key, value in needed.items() if claimed[key] != value}
    if checkpoint.layout == "vllm" and not changes and checkpoint.weights_file.suffix == ".safetensors":
        translation.notes.append(f"{directory}: vLLM's Medusa layout already, loaded as it is")
        return directory
    for key, value in changes.items():
        said = (f"config.json says {claimed[key]!r}" if claimed[key] is not None
                else f"config.json has none, vLLM's default is {defaults[key]!r}")
        source = "the blocks hold biases" if key == "medusa_fc_bias" else "from the weights"
        translation.notes.append(f"medusa {key} = {value!r} ({source}; {said})")
    if checkpoint.weights_file.suffix != ".safetensors":
        translation.notes.append(f"medusa weights {checkpoint.weights_file.name} rewritten as model.safetensors")
    translation.notes.append(f"medusa heads {checkpoint.layout} layout -> vLLM layout at {out_dir}")
    write_medusa_checkpoint(heads, checkpoint.state_dict, out_dir, layout="vllm",
                            base_model_name_or_path=checkpoint.base_model_name_or_path or "")
    return out_dir


def _eagle(directory: Path, translation: Translation) -> None:
    """An EAGLE-1 head vLLM runs faithfully only without biases: a head with "bias": true or an fc.bias is a known
    divergence (run as vLLM would, never reported as equivalent)."""
    from specbench.checkpoints.validate import read_json_object

    raw = read_json_object(directory / "config.json")
    if raw.get("bias") is True or raw.get("attention_bias") or _has_fc_bias(directory):
        translation.divergences.append(EAGLE_BIAS)


def _has_fc_bias(directory: Path) -> bool:
    from specbench.checkpoints.tensor_files import open_tensor_file
    from specbench.eagle.checkpoint import WEIGHTS_FILES

    for name in WEIGHTS_FILES:
        if (directory / name).is_file():
            keys, _ = open_tensor_file(directory / name)
            return "fc.bias" in keys
    return False
