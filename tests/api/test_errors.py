"""Every bad request is a 4xx in the called API's error shape, and the server keeps serving."""

import pytest

OPENAI = "/v1/embeddings"
COHERE = "/v2/rerank"
TEI = "/rerank"


def assert_openai_error(response, status: int, needle: str = ""):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert needle.lower() in error["message"].lower()


def assert_cohere_error(response, status: int, needle: str = ""):
    assert response.status_code == status, response.text
    assert list(response.json()) == ["message"]
    assert needle.lower() in response.json()["message"].lower()


def assert_tei_error(response, status: int):
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error", "error_type"}


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"input": []}, "empty"),
        ({"input": [""]}, "empty string"),
        ({"input": ["a", 1]}, "mix"),
        ({"input": [[]]}, "empty list"),
        ({"input": 5}, "invalid"),
        ({"input": "x", "encoding_format": "hex"}, "invalid"),
        ({"input": [[1, 2, 30522]]}, "vocabulary"),
        ({"input": [[-1, 5]]}, "vocabulary"),
        ({"input": ["x"] * 2049}, "2048"),
        ({"input": "word " * 300}, "256"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 385}, "dimensions"),
        ({"input": "x", "truncate_prompt_tokens": 1000}, "truncate_prompt_tokens"),
        ({"input": "x", "input_type": "poem"}, "input_type"),
        ({"input": "x", "prompt_name": "nope"}, "prompt_name"),
    ],
)
def test_openai_invalid_input_is_400(client, body, needle):
    assert_openai_error(client.post(OPENAI, json=body), 400, needle)


def test_over_long_input_names_both_token_counts(client):
    response = client.post(OPENAI, json={"input": ["ok", "word " * 300]})
    assert_openai_error(response, 400, "input 1 has 302 tokens")
    assert "256" in response.json()["error"]["message"]


def test_unknown_model_is_404_in_each_shape(client):
    assert_openai_error(client.post(OPENAI, json={"model": "nope", "input": "x"}), 404, "nope")
    assert_cohere_error(client.post(COHERE, json={"model": "nope", "query": "q", "documents": ["d"]}), 404)


def test_malformed_json_in_each_shape(client):
    headers = {"content-type": "application/json"}
    assert_openai_error(client.post(OPENAI, content=b'{"input": ', headers=headers), 400)
    assert_cohere_error(client.post(COHERE, content=b"{nope", headers=headers), 400)
    assert_cohere_error(client.post("/v1/rerank", content=b"[1,", headers=headers), 400)
    assert_tei_error(client.post(TEI, content=b"{", headers=headers), 422)


def test_wrong_types_and_missing_fields(client):
    assert_openai_error(client.post(OPENAI, json={"model": "x"}), 400, "input")
    assert_cohere_error(client.post(COHERE, json={"query": 3, "documents": ["a"]}), 400)
    assert_cohere_error(client.post(COHERE, json={"query": "q", "documents": "a"}), 400)
    assert_tei_error(client.post(TEI, json={"query": "q", "texts": [1]}), 422)


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"query": "q", "documents": []}, "documents"),
        ({"query": " ", "documents": ["a"]}, "query"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
        ({"query": "q", "documents": ["a"] * 1001}, "1000"),
        ({"query": "word " * 300, "documents": ["a"]}, "query"),
    ],
)
def test_cohere_invalid_input_is_400(client, body, needle):
    assert_cohere_error(client.post(COHERE, json=body), 400, needle)


def test_v1_rank_fields_must_exist(client):
    body = {"query": "q", "documents": [{"title": "t"}], "rank_fields": ["title", "body"]}
    assert_cohere_error(client.post("/v1/rerank", json=body), 400, "body")
    assert_cohere_error(
        client.post("/v1/rerank", json={"query": "q", "documents": [{"title": "t"}]}), 400, "text"
    )
    assert_cohere_error(
        client.post("/v1/rerank", json={"query": "q", "documents": ["a"], "max_chunks_per_doc": 0}), 400
    )


def test_tei_invalid_input_is_422(client):
    assert_tei_error(client.post(TEI, json={"query": "q", "texts": []}), 422)


def test_body_over_the_limit_is_413(client):
    body = b'{"input": "' + b"a" * (8 * 1024 * 1024) + b'"}'
    assert_openai_error(client.post(OPENAI, content=body, headers={"content-type": "application/json"}), 413)
    assert_tei_error(client.post(TEI, content=body, headers={"content-type": "application/json"}), 413)


def test_unknown_route_is_404_and_every_response_has_a_request_id(client):
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.headers["x-request-id"]
    echoed = client.get("/health", headers={"x-request-id": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"


def test_server_keeps_serving_after_bad_requests(client):
    for body in (b"{", b'{"input": [[99999999]]}', b'{"input": null}'):
        client.post(OPENAI, content=body, headers={"content-type": "application/json"})
    response = client.post(OPENAI, json={"input": "still alive"})
    assert response.status_code == 200
    assert len(response.json()["data"][0]["embedding"]) == 384


@pytest.mark.parametrize(
    ("path", "body", "asks", "foreign"),
    [
        ("/v1/embeddings", {"input": ["a", "word " * 300]}, "truncate_prompt_tokens", 'truncate "END"'),
        ("/v2/embed", {"texts": ["word " * 300], "truncate": "NONE"}, 'truncate "END" or "START"', "_prompt"),
        ("/embed", {"inputs": ["word " * 300]}, "truncate: true", "truncate_prompt_tokens"),
    ],
)
def test_an_over_long_input_names_the_called_apis_truncation_field(client, path, body, asks, foreign):
    response = client.post(path, json=body)
    assert 400 <= response.status_code < 500, response.text
    payload = response.json()
    message = payload.get("message") or payload["error"]
    message = message["message"] if isinstance(message, dict) else message
    assert "more than the model's maximum of 256" in message
    assert asks in message and foreign not in message
