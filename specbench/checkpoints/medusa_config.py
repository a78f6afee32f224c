"""The Medusa heads config (model_type "medusa", registered with AutoConfig) and the normalisation of
old FasterDecoding configs, which lack model_type and name their fields medusa_num_heads/_layers.
"""

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, PreTrainedConfig

from specbench.checkpoints.tensor_files import CheckpointError

# normalised field name -> the name old FasterDecoding configs use for it
LEGACY_FIELD_NAMES = {"num_heads": "medusa_num_heads", "num_hidden_layers": "medusa_num_layers"}


@dataclass(frozen=True)
class MedusaHeadsConfig:
    """The shape of a set of Medusa heads, as the weights show it (what the loader checks and builds)."""

    num_heads: int
    num_layers: int  # residual blocks per head
    hidden_size: int
    vocab_size: int
    has_vocab_projection: bool = True  # False: "version 2", heads reuse the target's lm_head


class MedusaCheckpointError(CheckpointError):
    """A Medusa checkpoint (config or weights) that does not describe heads this loader can build."""


@strict
class MedusaConfig(PreTrainedConfig):
    """Medusa heads: num_heads heads of num_hidden_layers residual blocks each (vLLM's field names).

    hidden_size and vocab_size are None when the source config did not record them (old
    FasterDecoding configs); they are then the target's.
    """

    model_type = "medusa"

    num_heads: int | None = None
    num_hidden_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    # vLLM (<= 0.32) builds block biases only when this is set; FasterDecoding blocks always have them
    medusa_fc_bias: bool = True
    base_model_name_or_path: str | None = None

    def validate_architecture(self):
        """Part of @strict validation: counts and sizes, where given, are positive."""
        for name, minimum in (("num_heads", 1), ("num_hidden_layers", 0), ("hidden_size", 1), ("vocab_size", 1)):
            value = getattr(self, name)
            if value is not None and value < minimum:
                raise ValueError(f"{name} = {value}, expected an integer >= {minimum}")


def register_medusa_config() -> None:
    """Make AutoConfig map model_type "medusa" to MedusaConfig; safe to call any number of times."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if "medusa" in CONFIG_MAPPING:
        registered = CONFIG_MAPPING["medusa"]
        if registered is not MedusaConfig:
            warnings.warn(
                f"AutoConfig already maps model_type 'medusa' to {registered.__module__}.{registered.__qualname__}; "
                "leaving it in place, so AutoConfig will not return specbench's MedusaConfig",
                stacklevel=2,
            )
        return
    AutoConfig.register("medusa", MedusaConfig)


register_medusa_config()


def read_config_json(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """(config file, its JSON object) for a directory or a config.json path."""
    path = Path(path)
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        raise MedusaCheckpointError(f"{config_file}: no such file; a Medusa checkpoint directory needs a config.json")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MedusaCheckpointError(f"{config_file}: not valid JSON ({e}); re-download or re-export the checkpoint") from e
    if not isinstance(raw, dict):
        raise MedusaCheckpointError(f"{config_file}: expected a JSON object, found {type(raw).__name__}")
    return config_file, raw


def config_field(raw: dict[str, Any], field: str, config_file: Path) -> tuple[str, Any] | None:
    """(name used in the file, value) for a normalised field, accepting its legacy name; None if absent."""
    legacy = LEGACY_FIELD_NAMES.get(field)
    present = [name for name in (field, legacy) if name is not None and name in raw]
    if len(present) == 2 and raw[field] != raw[legacy]:
        raise MedusaCheckpointError(
            f"{config_file}: {field} = {raw[field]!r} but {legacy} = {raw[legacy]!r}; keep one of them"
        )
    return (present[0], raw[present[0]]) if present else None


def normalise_medusa_config(raw: dict[str, Any], config_file: Path) -> MedusaConfig:
    """A MedusaConfig from an old FasterDecoding (no model_type) or a vLLM (model_type "medusa") dict."""
    model_type = raw.get("model_type")
    if model_type not in (None, "medusa"):
        raise MedusaCheckpointError(
            f"{config_file}: model_type is {model_type!r}, expected none (old FasterDecoding heads) or 'medusa' "
            "(vLLM layout); a Medusa-2 whole model is read with specbench.checkpoints.medusa.read_medusa_checkpoint"
        )
    values = {key: value for key, value in raw.items() if key not in LEGACY_FIELD_NAMES.values()}
    for field in LEGACY_FIELD_NAMES:
        found = config_field(raw, field, config_file)
        if found is not None:
            values[field] = found[1]
    # the model_type injection vLLM added for old directories, so AutoConfig can recognise them
    values["model_type"] = "medusa"
    try:
        return MedusaConfig.from_dict(values)
    except (TypeError, ValueError, StrictDataclassError) as e:
        renamed = [f"{legacy} -> {field}" for field, legacy in LEGACY_FIELD_NAMES.items() if legacy in raw]
        note = f" (read with the renames {', '.join(renamed)})" if renamed else ""
        raise MedusaCheckpointError(f"{config_file}: {e}{note}") from e


def load_medusa_config(path: str | os.PathLike, *, hidden_size: int | None = None, vocab_size: int | None = None) -> MedusaConfig:
    """Read a Medusa heads config.json (directory or file) into a normalised MedusaConfig.

    Never writes to `path`; `config.save_pretrained(other_dir)` gives a copy AutoConfig can read.
    hidden_size/vocab_size fill fields the file lacks (the target's); a conflicting value is an error.
    """
    config_file, raw = read_config_json(path)
    config = normalise_medusa_config(raw, config_file)
    for field, target_value in (("hidden_size", hidden_size), ("vocab_size", vocab_size)):
        if target_value is None:
            continue
        recorded = getattr(config, field)
        if recorded is None:
            setattr(config, field, target_value)
        elif recorded != target_value:
            raise MedusaCheckpointError(
                f"{config_file}: {field} = {recorded} but the target's is {target_value}; "
                "these heads were trained for a different base model"
            )
    return config
