"""pack(): sequences laid end to end with their positions and cu_seqlens, from lists of Python ints (the
server's requests) or from views of one tokenized array (bulk jobs' chunks), with the same batch."""

import numpy as np
import pytest
import torch

from engine.batch import count_row_tokens, pack
from engine.outputs import MARKER, RERANK, HeadOutput

SEQUENCES = [[101, 7, 8, 102], [101, 9, 102], [101, 4, 5, 6, 3, 102]]


def test_sequences_are_laid_end_to_end_with_positions_restarting_per_sequence():
    batch = pack(SEQUENCES, [None, [0, 1, 1], None])
    assert batch.input_ids.tolist() == [id_ for ids in SEQUENCES for id_ in ids]
    assert batch.positions.tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5]
    assert batch.cu_seqlens.tolist() == [0, 4, 7, 13] and batch.cu_seqlens.dtype == torch.int32
    assert batch.token_type_ids.tolist() == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    assert batch.max_seqlen == 6 and batch.num_seqs == 3 and batch.num_tokens == 13


def test_views_of_one_int32_array_pack_as_the_same_lists_do():
    flat = np.array([id_ for ids in SEQUENCES for id_ in ids], dtype=np.int32)
    views = [flat[0:4], flat[4:7], flat[7:13]]
    from_lists, from_views = pack(SEQUENCES), pack(views)
    for name in ("input_ids", "token_type_ids", "positions", "cu_seqlens"):
        expected, got = getattr(from_lists, name), getattr(from_views, name)
        assert got.dtype == expected.dtype and torch.equal(got, expected), name
    assert from_views.input_ids.dtype == torch.int64  # the embedding lookup's index type
    assert from_views.max_seqlen == from_lists.max_seqlen


def test_an_empty_sequence_is_refused():
    with pytest.raises(ValueError):
        pack([[101, 102], []])


def test_row_tokens_name_the_rows_in_order_and_count_per_sequence():
    sequences = [[5, 9, 1, 9, 7], [9], [3, 7, 4]]
    batch = pack(sequences, output=HeadOutput(MARKER, 4, (RERANK,), row_tokens=(9, 7)))
    assert batch.row_index.tolist() == [1, 3, 4, 5, 7]
    assert [count_row_tokens(ids, (9, 7)) for ids in sequences] == [3, 1, 1]
    assert count_row_tokens(np.array([9, 9, 2]), (9, 7)) == 2
    assert pack(sequences).row_index is None
