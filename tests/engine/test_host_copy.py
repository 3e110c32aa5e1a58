"""Host copies of step rows: large ones (on torch's threads) and small ones give the same rows, and a copy
is the caller's own."""

import numpy as np
import pytest

from engine.host_copy import PARALLEL_COPY_FLOATS, copied
from engine.request import EngineOutput, EngineRequest


class Collected(EngineRequest):
    __slots__ = ("output",)

    def __init__(self, num_seqs: int):
        super().__init__(num_seqs)
        self.output: EngineOutput | None = None

    def done(self, output: EngineOutput) -> None:
        self.output = output


@pytest.mark.parametrize("num_rows", [3, PARALLEL_COPY_FLOATS // 64 + 7])
def test_a_copy_holds_the_rows_and_is_its_own(num_rows):
    rows = np.random.default_rng(0).standard_normal((num_rows, 64)).astype(np.float32)
    kept = rows.copy()
    copy = copied(rows)
    rows[:] = 0.0  # the source buffer serves the next step
    np.testing.assert_array_equal(copy, kept)


@pytest.mark.parametrize("num_rows", [5, PARALLEL_COPY_FLOATS // 32 + 11])
def test_a_request_of_token_rows_over_two_batches_gets_them_in_order(num_rows):
    rows = np.random.default_rng(1).standard_normal((num_rows, 65)).astype(np.float32)
    first = num_rows // 2
    request = Collected(2)
    request.expect_rows([first, num_rows - first])
    request.set_rows(1, rows[first:])  # batches may finish a request's sequences in either order
    assert request.output is None
    request.set_rows(0, rows[:first])
    np.testing.assert_array_equal(request.output.rows, rows)
