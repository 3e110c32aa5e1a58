"""select_prompt: prompt_name, then input_type (OpenAI- and Cohere-style names), then the model's default."""

import pytest

from api.errors import InvalidInput
from api.prompts import select_prompt

QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
    "document": "",
}
E5_PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.mark.parametrize("input_type", ["query", "search_query"])
def test_query_input_types_pick_the_query_prompt(input_type):
    assert select_prompt(QWEN3_PROMPTS, input_type, None) == QWEN3_PROMPTS["query"]


@pytest.mark.parametrize("input_type", ["document", "search_document", "passage"])
def test_document_input_types_fall_back_between_document_and_passage(input_type):
    assert select_prompt(E5_PROMPTS, input_type, None) == "passage: "
    assert select_prompt(QWEN3_PROMPTS, input_type, None) == ""


def test_prompt_name_wins_over_input_type():
    assert select_prompt(E5_PROMPTS, "query", "passage") == "passage: "


def test_neither_field_is_no_prompt_unless_the_model_names_a_default():
    assert select_prompt(E5_PROMPTS, None, None) == ""
    assert select_prompt(E5_PROMPTS, None, None, default_prompt_name="query") == "query: "
    assert select_prompt(E5_PROMPTS, "document", None, default_prompt_name="query") == "passage: "


def test_a_model_without_prompts_embeds_a_query_as_is():
    assert select_prompt({}, "query", None) == ""


@pytest.mark.parametrize(
    ("input_type", "prompt_name", "param"), [("nonsense", None, "input_type"), (None, "nope", "prompt_name")]
)
def test_unknown_names_are_invalid_input(input_type, prompt_name, param):
    with pytest.raises(InvalidInput) as error:
        select_prompt(E5_PROMPTS, input_type, prompt_name)
    assert error.value.param == param
