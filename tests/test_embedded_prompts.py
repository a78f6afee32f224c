"""The embedded "gsm8k-embedded" prompt set: loads from the package, zero-shot GSM8K format,
worked answers whose calculator annotations add up, and no question taken from GSM8K itself."""

from __future__ import annotations

import ast
import json
import math
import operator
import os
import re
from importlib import resources
from pathlib import Path

import pytest

from specbench.prompts import format_gsm8k_prompt, load_prompts
from specbench.prompts.load import EMBEDDED_PACKAGE_DIR, EMBEDDED_SETS

SET_NAME = "gsm8k-embedded"
MIN_PROMPTS = 60  # the size the set was asked to have; fewer makes acceptance-rate means noisy
# GSM8K's calculator annotation: <<expression=value>>
ANNOTATION = re.compile(r"<<([^=<>]*)=([^<>]*)>>")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _records() -> list[dict]:
    resource = resources.files("specbench").joinpath(EMBEDDED_PACKAGE_DIR, EMBEDDED_SETS[SET_NAME])
    lines = resource.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _arithmetic(node: ast.AST) -> float:
    """Value of + - * / over numbers; anything else in a file's annotation is refused, not run."""
    if isinstance(node, ast.Expression):
        return _arithmetic(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arithmetic(node.operand)
    raise ValueError(f"not plain arithmetic: {ast.unparse(node)!r}")


def _answer_errors(answer: str) -> list[str]:
    """What is wrong with a worked answer: an annotation whose expression does not give its
    value, or a final ``#### N`` other than the last annotation's value."""
    annotations = ANNOTATION.findall(answer)
    if not annotations:
        return ["no <<expr=value>> annotation"]
    errors = []
    for expr, value in annotations:
        try:
            got = _arithmetic(ast.parse(expr, mode="eval"))
            if not math.isclose(got, float(value), rel_tol=1e-9, abs_tol=1e-9):  # float noise, e.g. 0.1*3
                errors.append(f"<<{expr}={value}>> evaluates to {got}")
        except (SyntaxError, ValueError, ZeroDivisionError) as err:
            errors.append(f"<<{expr}={value}>>: {err}")
    final = answer.rstrip().rsplit("\n", 1)[-1]
    if not final.startswith("#### "):
        errors.append(f"last line is {final!r}, expected '#### N'")
    elif not math.isclose(float(final[5:].replace(",", "")), float(annotations[-1][1]), abs_tol=1e-9):
        errors.append(f"{final!r} differs from the last annotation's value {annotations[-1][1]}")
    return errors


RECORDS = _records()


def test_set_loads_from_the_package():
    loaded = load_prompts(SET_NAME)
    assert loaded.source == "embedded"
    assert len(loaded) >= MIN_PROMPTS
    ids = [p.id for p in loaded]
    assert len(set(ids)) == len(ids)
    assert ids == [f"gsm8k-style-{i:03d}" for i in range(1, len(ids) + 1)]
    assert {p.category for p in loaded} == {"math_reasoning"}
    assert all(p.text.startswith("Question: ") and p.text.endswith("\nAnswer:") for p in loaded)
    assert load_prompts(SET_NAME, num_prompts=5).prompts == loaded.prompts[:5]


def test_prompt_is_the_zero_shot_gsm8k_format_of_its_question():
    for record in RECORDS:
        assert record["prompt"] == format_gsm8k_prompt(record["question"], []), record["id"]
    assert len({r["question"] for r in RECORDS}) == len(RECORDS)  # no question twice


@pytest.mark.parametrize("record", RECORDS, ids=[r["id"] for r in RECORDS])
def test_worked_answer_is_consistent(record):
    assert _answer_errors(record["answer"]) == []
    # multi-step: at least two calculator steps before the final line
    assert len(ANNOTATION.findall(record["answer"])) >= 2


def test_answer_check_catches_mistakes():
    assert _answer_errors("Ann has 3 * 4 = <<3*4=12>>12 pens.\n#### 12") == []
    assert _answer_errors("Ann has 3 * 4 = <<3*4=13>>13 pens.\n#### 13") == ["<<3*4=13>> evaluates to 12"]
    assert "differs from the last annotation" in _answer_errors("<<3*4=12>>12\n#### 11")[0]
    assert "not plain arithmetic" in _answer_errors("<<__import__('os')=0>>0\n#### 0")[0]
    assert _answer_errors("no steps\n#### 5") == ["no <<expr=value>> annotation"]


def _normalised(question: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", question.lower()))


def test_no_question_is_taken_from_gsm8k():
    root = os.environ.get("SPECBENCH_DATA_DIR")
    if not root:
        pytest.skip("SPECBENCH_DATA_DIR is unset; set it to the shared data directory (e.g. /work/shared/data)")
    files = sorted((Path(root) / "gsm8k").glob("*.jsonl"))
    if not files:
        pytest.skip(f"SPECBENCH_DATA_DIR={root} holds no gsm8k/*.jsonl")
    gsm8k = set()
    for path in files:
        with open(path, encoding="utf-8") as f:
            gsm8k.update(_normalised(json.loads(line)["question"]) for line in f if line.strip())
    assert len(gsm8k) > 1000  # test + train hold 8,792 questions; far fewer means the wrong files
    copied = [r["id"] for r in RECORDS if _normalised(r["question"]) in gsm8k]
    assert copied == []
