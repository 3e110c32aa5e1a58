"""The served contract the compatibility tests check: default model facts and error-body shapes."""

from __future__ import annotations

import base64

import httpx
import numpy as np

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_ALIAS = "all-MiniLM-L6-v2"
DIM = 384
WINDOW = 256
VOCAB_SIZE = 30522
MAX_INPUTS = 2048
MAX_BODY_BYTES = 8 * 1024 * 1024
SAME_VECTOR = 0.9999  # cosine threshold for "same vector" in fp32 (DESIGN.md)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def decode_base64(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype="<f4")


def words(num_words: int, word: str = "word") -> str:
    """A text of identical words: truncating it from either side gives the same tokens."""
    return " ".join([word] * num_words)


def assert_openai_error(response: httpx.Response, status_code: int) -> dict:
    assert response.status_code == status_code, response.text
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= error.keys(), error
    assert isinstance(error["message"], str) and error["message"], error
    return error


def assert_cohere_error(response: httpx.Response, status_code: int) -> str:
    assert response.status_code == status_code, response.text
    message = response.json()["message"]
    assert isinstance(message, str) and message, response.text
    return message


def assert_tei_error(response: httpx.Response, status_code: int) -> dict:
    assert response.status_code == status_code, response.text
    body = response.json()
    assert isinstance(body["error"], str) and body["error"], body
    assert isinstance(body["error_type"], str) and body["error_type"], body
    return body


def cohere_client(client_class, base_url: str, timeout: float):
    """A cohere SDK client (Client or ClientV2) that does not retry, on the SDK's 5.x and 7.x alike:
    7.x takes max_retries in its constructor, 5.x only per request (its default, 2 retries of a 429 or
    5xx, then stays; the RAG frameworks pin cohere below 6 or 7)."""
    import inspect

    options = {"max_retries": 0} if "max_retries" in inspect.signature(client_class).parameters else {}
    return client_class(base_url=base_url, api_key="x", timeout=timeout, **options)
