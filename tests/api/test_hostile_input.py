"""Hostile input on every route: a clear 4xx in the called API's error shape, never a 5xx, and the server
keeps serving. Complements test_errors.py and compat_tests/test_http.py, which cover malformed JSON,
wrong types, NaN in `input`, ids just outside the vocabulary, 2049 strings and 8 MiB bodies."""

import json

import pytest

OPENAI = "/v1/embeddings"
COHERE_V1 = "/v1/rerank"
COHERE_V2 = "/v2/rerank"
TEI = "/rerank"
ROUTES = [OPENAI, COHERE_V1, COHERE_V2, TEI]
JSON = {"content-type": "application/json"}


def texts_body(route: str, texts: list) -> dict:
    """A request whose texts (inputs, documents) are `texts`."""
    if route == OPENAI:
        return {"input": texts}
    if route == TEI:
        return {"query": "bread", "texts": texts}
    return {"query": "bread", "documents": texts}


def assert_error(response, route: str, status: int, needle: str = "") -> None:
    """`status` as OpenAI and Cohere answer it; TEI answers invalid input (400) with 422."""
    if route == TEI and status == 400:
        status = 422
    assert response.status_code == status, response.text
    payload = response.json()
    if route == TEI:
        assert set(payload) == {"error", "error_type"} and payload["error_type"] == "Validation"
        message = payload["error"]
    elif route in (COHERE_V1, COHERE_V2):
        assert list(payload) == ["message"]
        message = payload["message"]
    else:
        assert set(payload["error"]) == {"message", "type", "param", "code"}
        code = payload["error"]["code"]
        assert code is None or isinstance(code, str), code  # OpenAI's: a string or null, never the status
        message = payload["error"]["message"]
    assert needle.lower() in message.lower(), message
    assert response.headers["x-request-id"]


def assert_ok(response) -> dict | list:
    assert response.status_code == 200, response.text
    return response.json()


def test_openai_error_codes_are_openais_strings_or_null(client):
    """OpenAI's `code` names the fault where OpenAI has a name for it (its SDK's APIError.code), else null."""
    unknown = client.post(OPENAI, json={"model": "no-such-model", "input": "a"}).json()["error"]
    assert (unknown["type"], unknown["code"]) == ("not_found_error", "model_not_found")
    too_long = client.post(OPENAI, json={"input": ["fine", "word " * 400]}).json()["error"]
    assert too_long["code"] == "context_length_exceeded" and too_long["param"] == "input"
    empty = client.post(OPENAI, json={"input": ""}).json()["error"]
    assert (empty["type"], empty["code"]) == ("invalid_request_error", None)


# token ids


@pytest.mark.parametrize("ids", [[2**70], [-(2**70)], [2**64 - 1], [-(2**63) - 1], [5, 2**63, 7]])
def test_token_ids_far_outside_the_vocabulary_are_400(client, ids):
    assert_error(client.post(OPENAI, json={"input": ids}), OPENAI, 400, "vocabulary")
    assert_error(client.post(OPENAI, json={"input": [[101, 102], ids]}), OPENAI, 400, "vocabulary")


@pytest.mark.parametrize("value", [[1, [2, 3]], [[1, 2], 3], ["text", [101]], [[101], "text", 7]], ids=str)
def test_token_ids_mixed_with_lists_or_strings_are_400(client, value):
    assert_error(client.post(OPENAI, json={"input": value}), OPENAI, 400, "mix")


@pytest.mark.parametrize("value", [[True, False], [[101, True]], [[101, None]], [[[101]]]], ids=str)
def test_token_ids_of_other_types_are_400(client, value):
    assert_error(client.post(OPENAI, json={"input": value}), OPENAI, 400)


def test_2049_token_id_lists_are_400(client):
    assert_error(client.post(OPENAI, json={"input": [[101, 102]] * 2049}), OPENAI, 400, "2048")


# nesting


def nested_lists(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def nested_objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("nested", [nested_lists(100_000), nested_objects(100_000)], ids=["lists", "objects"])
def test_100k_levels_of_nesting_are_400(client, route, nested):
    field = {OPENAI: b"input", TEI: b"texts"}.get(route, b"documents")
    in_field = b'{"query": "q", "' + field + b'": ' + nested + b"}"
    assert_error(client.post(route, content=in_field, headers=JSON), route, 400)
    # an unknown field is skipped, but msgspec's decoder still recurses through it
    unknown = b'{"query": "q", "input": "x", "texts": ["x"], "documents": ["x"], "extra": ' + nested + b"}"
    assert_error(client.post(route, content=unknown, headers=JSON), route, 400, "nests too deeply")


@pytest.mark.parametrize("route", [COHERE_V1, COHERE_V2])
def test_a_document_object_nested_past_64_levels_is_400(client, route):
    deep = {"text": "bread"}
    for _ in range(100):
        deep = {"inner": deep}
    body = {"query": "bread", "documents": [{"text": "bread", "meta": deep}], "return_documents": True}
    assert_error(client.post(route, json=body), route, 400, "nests deeper than 64")
    shallow = {"text": "bread", "meta": [[[["ok"]]]]}
    results = assert_ok(client.post(route, json={**body, "documents": [shallow]}))["results"]
    assert results[0]["document"] == shallow


# bytes that are not valid UTF-8 or JSON numbers


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "text",
    [b"caf\xe9", b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"ends mid-character \xe2\x82"],
    ids=["latin-1", "bom-bytes", "overlong", "encoded-surrogate", "truncated"],
)
def test_invalid_utf8_is_400(client, route, text):
    body = b'{"query": "q", "input": "%s", "texts": ["%s"], "documents": ["%s"]}' % (text, text, text)
    assert_error(client.post(route, content=body, headers=JSON), route, 400)


@pytest.mark.parametrize("route", ROUTES)
def test_escaped_surrogates(client, route):
    lone = b'{"query": "q", "input": "\\ud800", "texts": ["\\ud800"], "documents": ["\\ud800"]}'
    assert_error(client.post(route, content=lone, headers=JSON), route, 400, "lone UTF-16 surrogate (U+D800)")
    low = lone.replace(b"\\ud800", b"a\\udc00")
    assert_error(client.post(route, content=low, headers=JSON), route, 400, "surrogate")
    pair = lone.replace(b"\\ud800", b"\\ud83d\\ude00")  # an emoji, escaped
    assert_ok(client.post(route, content=pair, headers=JSON))


@pytest.mark.parametrize("route", [COHERE_V1, COHERE_V2])
@pytest.mark.parametrize("text", [None, 5, ["a"], {"a": "b"}, True])
def test_a_document_text_that_is_no_string_is_400(client, route, text):
    body = {"query": "q", "documents": ["fine", {"text": text}]}
    assert_error(client.post(route, json=body), route, 400, "document 1's 'text' must be a string")
    body = {"query": "q", "documents": [{"title": text, "text": "t"}], "rank_fields": ["title", "text"]}
    assert_error(client.post(route, json=body), route, 400, "'title' must be a string")


@pytest.mark.parametrize(
    "route, body",
    [
        (OPENAI, b'{"input": "x", "dimensions": NaN}'),
        (OPENAI, b'{"input": [Infinity]}'),
        (OPENAI, b'{"input": [[101, -Infinity]]}'),
        (OPENAI, b'{"input": [1e999]}'),
        (OPENAI, b'{"input": "x", "truncate_prompt_tokens": 1e999}'),
        (COHERE_V1, b'{"query": "q", "documents": ["d"], "max_chunks_per_doc": Infinity}'),
        (COHERE_V2, b'{"query": "q", "documents": ["d"], "top_n": NaN}'),
        (COHERE_V2, b'{"query": "q", "documents": [{"text": NaN}]}'),
        (TEI, b'{"query": "q", "texts": [-Infinity]}'),
        (TEI, b'{"query": NaN, "texts": ["d"]}'),
    ],
)
def test_nan_and_infinity_are_400(client, route, body):
    assert_error(client.post(route, content=body, headers=JSON), route, 400)


# size


@pytest.fixture(scope="module")
def fifty_megabytes() -> bytes:
    return b'{"input": "' + b"a" * (50 * 1024 * 1024) + b'"}'


@pytest.mark.parametrize("route", ROUTES)
def test_a_50_mb_body_is_413_and_the_server_keeps_serving(client, route, fifty_megabytes):
    assert_error(client.post(route, content=fifty_megabytes, headers=JSON), route, 413, "too large")

    def chunks():  # no content-length: the limit holds on the bytes that arrive
        for start in range(0, len(fifty_megabytes), 1024 * 1024):
            yield fifty_megabytes[start : start + 1024 * 1024]

    assert_error(client.post(route, content=chunks(), headers=JSON), route, 413, "too large")
    assert_ok(client.post(route, json=texts_body(route, ["a normal text"])))


def test_100k_character_inputs(client):
    for long_text in ("word " * 20_000, "x" * 100_000):
        # refused on its characters, untokenized: past the 25,600 that 256 tokens read
        response = client.post(OPENAI, json={"input": long_text})
        assert_error(response, OPENAI, 400, "has 100000 characters, more than the 25600 that the model's")
        truncated = assert_ok(client.post(OPENAI, json={"input": long_text, "truncate_prompt_tokens": -1}))
        # 20,002 tokens cut to 256; one 100k-character word is a single [UNK] token for WordPiece
        assert truncated["usage"]["prompt_tokens"] == (256 if " " in long_text else 3)


@pytest.mark.parametrize("route", [COHERE_V1, COHERE_V2, TEI])
def test_100k_character_documents_are_chunked_and_queries_are_400(client, route):
    long_text = "word " * 20_000
    assert_ok(client.post(route, json=texts_body(route, [long_text, "bread"])))
    body = {**texts_body(route, ["bread"]), "query": long_text}
    assert_error(client.post(route, json=body), route, 400, "query")


def test_a_7_mb_document_is_read_as_far_as_rerank_reads_it(client, monkeypatch):
    """Cut before tokenization to what rerank reads (v2: max_tokens_per_doc; v1: max_chunks_per_doc
    windows), it scores as a document of its first words does, and no text the tokenizer gets is longer
    than those tokens span (100 characters each for the bundled WordPiece)."""
    from api.tokenize import TextEncoder

    longest = []
    content_ids = TextEncoder.content_ids
    monkeypatch.setattr(
        TextEncoder,
        "content_ids",
        lambda self, texts: longest.append(max(map(len, texts))) or content_ids(self, texts),
    )
    huge, start = "bread and butter " * 420_000, "bread and butter " * 400
    for body in ({"max_tokens_per_doc": 16}, {"max_chunks_per_doc": 2}):
        route = COHERE_V2 if "max_tokens_per_doc" in body else COHERE_V1
        scored = assert_ok(
            client.post(route, json={"query": "breakfast", "documents": [huge, start], **body})
        )
        scores = {item["index"]: item["relevance_score"] for item in scored["results"]}
        assert scores[0] == pytest.approx(scores[1], abs=1e-6)
    assert len(huge) > 7_000_000 and max(longest) <= (2 * 256 + 2) * 100


# empty and too many


@pytest.mark.parametrize("route", [COHERE_V1, COHERE_V2, TEI])
def test_empty_queries_and_lists_are_400(client, route):
    for query in ("", "\n\t "):
        body = {**texts_body(route, ["d"]), "query": query}
        assert_error(client.post(route, json=body), route, 400, "query must not be empty or only whitespace")
    assert_error(client.post(route, json=texts_body(route, [])), route, 400, "empty")


SCORE = "/v1/score"


@pytest.mark.parametrize("route", [COHERE_V1, COHERE_V2, TEI, SCORE])
def test_an_empty_document_is_400_naming_its_index_and_whitespace_is_scored(client, route):
    """One rule on every route that takes documents, as on those that take texts: no empty string."""
    body = {"text_1": "bread", "text_2": ["a", ""]} if route == SCORE else texts_body(route, ["a", ""])
    param = {TEI: "texts", SCORE: "text_2"}.get(route, "documents")
    assert_error(client.post(route, json=body), route, 400, f"{param}[1] is an empty string")
    if route == SCORE:
        error = client.post(route, json=body).json()["error"]
        assert error["param"] == "text_2" and error["code"] is None
        body = {"queries": "bread", "documents": ["a", ""]}
        assert_error(client.post(route, json=body), route, 400, "documents[1] is an empty string")
        payload = assert_ok(client.post(route, json={"text_1": "bread", "text_2": ["a", " "]}))
        assert len(payload["data"]) == 2
    else:
        payload = assert_ok(client.post(route, json=texts_body(route, ["a", " ", "\n"])))
        assert len(payload if route == TEI else payload["results"]) == 3
    if route == COHERE_V1:  # a document object's text, too
        body = {"query": "bread", "documents": [{"text": "a"}, {"text": ""}]}
        assert_error(client.post(route, json=body), route, 400, "documents[1] is an empty string")


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"text_1": " ", "text_2": ["a"]}, "text_1 must not be empty or only whitespace"),
        ({"text_1": ["a", "\t"], "text_2": ["a", "b"]}, "text_1[1] must not be empty or only whitespace"),
        ({"queries": "", "documents": "a"}, "queries[0] is an empty string"),
    ],
)
def test_a_score_query_of_whitespace_is_400_as_reranks_is(client, body, needle):
    assert_error(client.post(SCORE, json=body), SCORE, 400, needle)


@pytest.mark.parametrize("route", [COHERE_V1, TEI])
def test_1001_documents_are_400(client, route):
    assert_error(client.post(route, json=texts_body(route, ["d"] * 1001)), route, 400, "1000")


# integers out of every range


@pytest.mark.parametrize("dimensions", [-1, -(2**70), 2**31, 2**70])
def test_dimensions_out_of_range_are_400(client, dimensions):
    body = {"input": "x", "dimensions": dimensions}
    assert_error(client.post(OPENAI, json=body), OPENAI, 400, "dimensions")


@pytest.mark.parametrize(
    "route, field, value",
    [
        (OPENAI, "truncate_prompt_tokens", 2**70),
        (OPENAI, "truncate_prompt_tokens", -(2**70)),
        (COHERE_V2, "top_n", -(2**70)),
        (COHERE_V2, "max_tokens_per_doc", -1),
        (COHERE_V1, "max_chunks_per_doc", -(2**70)),
    ],
)
def test_huge_or_negative_limits_are_400(client, route, field, value):
    body = {**texts_body(route, ["bread"]), field: value}
    assert_error(client.post(route, json=body), route, 400, field)


@pytest.mark.parametrize(
    "route, field",
    [(COHERE_V2, "top_n"), (COHERE_V2, "max_tokens_per_doc"), (COHERE_V1, "max_chunks_per_doc")],
)
def test_huge_limits_that_only_allow_more_are_accepted(client, route, field):
    body = {**texts_body(route, ["bread", "butter"]), field: 2**70}
    assert len(assert_ok(client.post(route, json=body))["results"]) == 2


@pytest.mark.parametrize("encoding_format", ["", "FLOAT", "Base64", None, 1])
def test_unknown_encoding_formats_are_400(client, encoding_format):
    body = {"input": "x", "encoding_format": encoding_format}
    assert_error(client.post(OPENAI, json=body), OPENAI, 400, "encoding_format")


# what is not a JSON object


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("body", [b"[]", b"null", b'"text"', b"5", b"true", b"{}", b"\x00", b" "])
def test_bodies_that_are_not_a_request_object_are_400(client, route, body):
    assert_error(client.post(route, content=body, headers=JSON), route, 400)


@pytest.mark.parametrize("route", ROUTES)
def test_a_json_body_is_read_whatever_its_content_type(client, route):
    """curl -d sends application/x-www-form-urlencoded; the body is JSON all the same."""
    content = json.dumps(texts_body(route, ["bread"])).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/octet-stream"):
        assert_ok(client.post(route, content=content, headers={"content-type": content_type}))
    assert_ok(client.post(route, content=content, headers={"content-type": ""}))


@pytest.mark.parametrize("route", ROUTES)
def test_form_and_multipart_bodies_are_400(client, route):
    assert_error(client.post(route, data={"input": "x", "query": "q"}), route, 400, "not valid JSON")
    assert_error(client.post(route, files={"input": b"x"}), route, 400, "not valid JSON")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_other_methods_are_405(client, route, method):
    response = client.request(method, route)
    assert response.status_code == 405, response.text
    assert response.headers["x-request-id"]


def test_the_server_still_answers_a_normal_request(client):
    payload = assert_ok(client.post(OPENAI, json={"input": ["still", "serving"]}))
    assert len(payload["data"]) == 2 and len(payload["data"][0]["embedding"]) == 384
    ranked = assert_ok(client.post(COHERE_V2, json={"query": "bread", "documents": ["bread", "cars"]}))
    assert ranked["results"][0]["index"] == 0
