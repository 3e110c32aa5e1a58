"""Templates read off a tokenizer rebuild exactly what the tokenizer itself makes; the Qwen3 judge
prompt tokenized in two parts gives the ids of its model card's one string, and a chat template's pair
the ids of its whole rendered text."""

import pytest

from scoring.templates import QWEN3_JUDGE, PairTemplate, SingleTemplate

TEXTS = ["what is a cat?", "Cats are small felines, häufig gehalten 猫 🐱."]


def test_single_template_matches_the_tokenizer(minilm_tokenizer):
    template = SingleTemplate.from_tokenizer(minilm_tokenizer)
    for text in TEXTS:
        content = minilm_tokenizer.encode(text, add_special_tokens=False).ids
        assert template.apply(content) == minilm_tokenizer.encode(text).ids
    assert template.num_special_tokens == 2


def test_pair_template_matches_the_tokenizer_ids_and_types(minilm_tokenizer):
    template = PairTemplate.from_tokenizer(minilm_tokenizer)
    query, document = TEXTS
    expected = minilm_tokenizer.encode(query, document)
    ids, type_ids = template.apply(
        minilm_tokenizer.encode(query, add_special_tokens=False).ids,
        minilm_tokenizer.encode(document, add_special_tokens=False).ids,
    )
    assert ids == expected.ids
    assert type_ids.tolist() == expected.type_ids and 1 in expected.type_ids
    assert template.has_types
    assert template.num_special_tokens == 3


def byte_level_bpe():
    """A small byte-level BPE with Qwen's pre-tokenizer split and its chat specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    qwen_split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen_split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [*TEXTS, "yes no <Document>: <Query>: <Instruct>: Judge whether the Document meets"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def test_judge_prompt_tokenizes_as_the_one_string_of_its_model_card():
    # Qwen3-Reranker's card tokenizes prefix + "<Instruct>: ...\n<Query>: ...\n<Document>: {doc}" + suffix;
    # posy tokenizes the query part and each document apart, and must get the same ids
    tokenizer = byte_level_bpe()
    template = QWEN3_JUDGE.pair_template(tokenizer)
    query = "what is a cat?"
    for document in [*TEXTS, "", "x", "  two spaces", "\nnew line", "42 cats", "'s quoted", "猫"]:
        for instruction in (None, "Find feline facts"):
            ids, types = template.apply(
                tokenizer.encode(QWEN3_JUDGE.query_text(query, instruction), add_special_tokens=False).ids,
                tokenizer.encode(QWEN3_JUDGE.document_text(document), add_special_tokens=False).ids,
            )
            text = (
                f"<Instruct>: {instruction or QWEN3_JUDGE.default_instruction}\n<Query>: {query}\n"
                f"<Document>: {document}"
            )
            prefix = tokenizer.encode(QWEN3_JUDGE.prefix, add_special_tokens=False).ids
            suffix = tokenizer.encode(QWEN3_JUDGE.suffix, add_special_tokens=False).ids
            assert ids == prefix + tokenizer.encode(text, add_special_tokens=False).ids + suffix, document
            assert set(types) == {0}
    assert not template.has_types  # so the engine gets none


CHAT_TEMPLATES = {
    "space before the content": "{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}"
    "<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "punctuation before the content": "<Query>:{{ messages[0]['content'] }}\n<Document>:"
    "{{ messages[1]['content'] }}",
    "a newline and a special token": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}{% endfor %}",
}


@pytest.mark.parametrize("source", list(CHAT_TEMPLATES.values()), ids=list(CHAT_TEMPLATES))
def test_a_chat_template_pair_tokenizes_as_its_whole_rendered_text(source):
    """sentence-transformers tokenizes the rendered template at once; posy tokenizes the query and each
    document apart and must get the same ids."""
    from scoring.chat_template import render_pair
    from scoring.templates import ChatPairPrompt

    tokenizer = byte_level_bpe()
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    variables = {"add_generation_prompt": True}
    prompt = ChatPairPrompt.from_template(source, variables, tokenizer)
    template = prompt.pair_template(tokenizer)
    query = "what is a cat?"
    for document in [*TEXTS, "", "x", "  two spaces", "\nnew line", "42 cats", "'s quoted", ":colon", "猫"]:
        ids, _ = template.apply(
            tokenizer.encode(prompt.query_text(query), add_special_tokens=False).ids,
            tokenizer.encode(prompt.document_text(document), add_special_tokens=False).ids,
        )
        whole = render_pair(source, variables, query, document)
        assert ids == tokenizer.encode(whole, add_special_tokens=False).ids, (document, whole)


def test_a_chat_template_without_the_document_cannot_lay_out_a_pair():
    from scoring.errors import TemplateError
    from scoring.templates import ChatPairPrompt

    with pytest.raises(TemplateError, match="does not render the query and the document once each"):
        ChatPairPrompt.from_template("{{ messages[0]['content'] }}", {}, byte_level_bpe())
