"""What every fault scenario shares: its bodies, its verdict and the guard switch.

Each `test_faults*.py` module holds scenarios (numbered across the suite: the
report sorts by number); the `make_stack` fixture is in this folder's conftest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from sklearn.datasets import load_digits

from tests.faults.harness import Tally
from tests.faults.report import record

ROWS = load_digits().data.tolist()
ON, OFF = True, False


def digits(i: int = 0) -> dict[str, Any]:
    return {"model": "digits", "inputs": {"pixels": [ROWS[i % len(ROWS)]]}}


def grpc_slow_inputs(seconds: float) -> list[Any]:
    """The `slow` model's inputs as tritonclient sends them (about `seconds` of work)."""
    x = grpcclient.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.full((1, 64), 0.1, np.float32))
    steps = grpcclient.InferInput("steps", [1], "INT64")
    steps.set_data_from_numpy(np.array([max(1, int(seconds / 2e-6))], np.int64))
    return [x, steps]


def slow(seconds: float) -> dict[str, Any]:
    return {"model": "slow", "inputs": {"x": [[0.1] * 64], "steps": [max(1, int(seconds / 2e-6))]}}


def check(tally: Tally, guarded: bool, failure: Callable[[Tally], bool]) -> None:
    """Records the tally; with the guard on nothing may be lost, doubled or illegal
    (no job, result or streamed token), with it off `failure` must hold (the
    scenario shows what the guard prevents)."""
    record(tally)
    if guarded:
        assert tally.lost == 0, tally
        assert tally.duplicate_results == 0 and tally.illegal_transitions == 0, tally
        assert tally.completed == tally.acknowledged, tally
        assert not tally.duplicate_tokens and not tally.missing_tokens, tally
    else:
        assert failure(tally), f"with its guard off the scenario should fail: {tally}"


GUARD = pytest.mark.parametrize("guarded", [ON, OFF], ids=["guard on", "guard off"])
