"""Pooling over packed segments: mean, CLS and last token on a hand-made batch, exact."""

import pytest
import torch

from engine.attention import AttentionMetadata
from engine.errors import UnsupportedModel
from engine.layers.pooling import Pooler

# three sequences of lengths 2, 1 and 3
HIDDEN = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [9.0, 10.0], [11.0, 0.0]])


@pytest.fixture
def meta():
    return AttentionMetadata.build(torch.tensor([0, 2, 3, 6], dtype=torch.int32), max_seqlen=3)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("mean", [[2.0, 3.0], [5.0, 6.0], [9.0, 6.0]]),
        ("cls", [[1.0, 2.0], [5.0, 6.0], [7.0, 8.0]]),
        ("last", [[3.0, 4.0], [5.0, 6.0], [11.0, 0.0]]),
    ],
)
def test_pooling_methods(meta, method, expected):
    pooled = Pooler(method, normalize=False)(HIDDEN, meta)
    assert pooled.dtype == torch.float32
    torch.testing.assert_close(pooled, torch.tensor(expected))


def test_normalize_in_float32(meta):
    pooled = Pooler("mean", normalize=True)(HIDDEN.to(torch.bfloat16), meta)
    assert pooled.dtype == torch.float32
    torch.testing.assert_close(pooled.norm(dim=-1), torch.ones(3))
    expected = torch.nn.functional.normalize(torch.tensor([[2.0, 3.0], [5.0, 6.0], [9.0, 6.0]]), dim=-1)
    torch.testing.assert_close(pooled, expected)


def test_unknown_method():
    with pytest.raises(UnsupportedModel, match="unknown pooling method"):
        Pooler("max", normalize=False)
