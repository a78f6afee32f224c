"""Which errors are the user's (one line, exit status 2), and tracing a library's load error to the damaged file."""

from __future__ import annotations

import json

from specbench.cases import Case


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def damaged_file(case: Case) -> str | None:
    """The first file of the case's model directories (target, proposer checkpoint) that does not parse, with
    the reason: the libraries that read them (transformers, tokenizers) say what is wrong but not where."""
    from specbench.cases.requirements import expand_ref
    from specbench.checkpoints.resolve import resolve_model_dir
    from specbench.checkpoints.tensor_files import CheckpointError, check_safetensors_file

    for ref in filter(None, (case.target, case.proposer.get("path"))):
        try:
            directory = resolve_model_dir(expand_ref(ref))
        except Exception:  # noqa: BLE001 - a reference that does not resolve was not what failed to parse
            continue
        for path in sorted(directory.glob("*.json")):
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, OSError) as err:
                return f"{path}: not valid JSON ({first_line(err)}); re-download or re-export the model"
        for path in sorted(directory.glob("*.safetensors")):
            try:
                check_safetensors_file(path)  # the checkpoint loaders' own structural check
            except CheckpointError as err:
                return first_line(err)
    return None


def load_error(case: Case, err: BaseException) -> ValueError:
    """A one-line error for a model file that a library failed to read, naming the file where it can be found."""
    damaged = damaged_file(case)
    if damaged:
        return ValueError(f"{damaged} (case {case.case_id})")
    models = " and ".join(repr(ref) for ref in filter(None, (case.target, case.proposer.get("path"))))
    return ValueError(f"case {case.case_id}: a file of {models} could not be read ({type(err).__name__}: "
                      f"{first_line(err)}); check the files of those model directories, or re-download them")


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input (bad names, missing or damaged data, models, checkpoints, baselines): printed in
    one line, exit status 2. ValueError covers CheckpointError (MedusaCheckpointError), InvalidModelRef and
    HistoryError; OSError covers FileNotFoundError and ReferenceMissing, and unreadable files.

    Only the classes of modules already imported: an error can only be raised by a module that was loaded, and
    importing one here (safetensors, the prompt sources with datasets, torch) would make every exit of a light
    command, `specbench --help` included, pay for them."""
    import sys

    errors: list[type[BaseException]] = [ValueError, OSError]
    for module, name in (("safetensors", "SafetensorError"), ("specbench.checkpoints.resolve", "ModelUnavailable"),
                         ("specbench.gating.baselines", "BaselineError"), ("specbench.prompts", "DatasetUnavailable")):
        if module in sys.modules:
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)
