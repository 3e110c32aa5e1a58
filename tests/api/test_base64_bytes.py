"""decode_base64 against Python's strict decoder: the same bytes for every length and byte, the same
refusals."""

import base64

import numpy as np
import pytest

from api.base64_bytes import decode_base64


@pytest.mark.parametrize("length", [0, 1, 2, 3, 4, 5, 57, 1000, 300_001])
def test_the_bytes_of_base64(length):
    data = np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8).tobytes()
    assert decode_base64(base64.b64encode(data).decode()) == data
    assert decode_base64(base64.b64encode(bytes(range(256)) * 3).decode()) == bytes(range(256)) * 3


REFUSED = ["QQ", "QUJ", "QQ=", "Q===", "====", "QQ=A", "QU=D", "QUJD\n", "QU JD", "QUJ-", "QUJé", "=QUJ"]


@pytest.mark.parametrize("text", REFUSED)
def test_what_the_strict_decoder_refuses(text):
    with pytest.raises(ValueError):  # binascii.Error, or a non-ASCII string's ValueError
        base64.b64decode(text, validate=True)
    with pytest.raises(ValueError):
        decode_base64(text)
