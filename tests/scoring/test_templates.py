"""Templates read off a tokenizer rebuild exactly what the tokenizer itself makes."""

from scoring.templates import PairTemplate, SingleTemplate

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
    assert type_ids == expected.type_ids
    assert template.num_special_tokens == 3
