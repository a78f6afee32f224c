"""N-gram (prompt lookup) suite: acceptance and lossless decoding on the reference model."""

from __future__ import annotations

import pytest

from specbench.pytest_plugin import case_params, skip_unless_available


@pytest.mark.parametrize("case", case_params("ngram"))
def test_ngram_case(case, specbench_run):
    skip_unless_available(case)
    specbench_run(case)
