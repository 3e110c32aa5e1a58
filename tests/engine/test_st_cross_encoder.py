"""sentence-transformers 6 CrossEncoder folders ("model_type": "CrossEncoder") serve as rerankers: a
sequence classifier alone (posy's sigmoid of the logit equals CrossEncoder.predict on the same folder),
or a causal LM with its LogitScore module (a judge of the true and false tokens, pairs laid out by the
chat template; its scores are checked end to end in compat_tests); other modules, a LogitScore on a
classifier, or a causal LM without LogitScore, are start-up errors naming them."""

import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer

from engine.checkpoint.resolve import resolve_model
from engine.errors import UnsupportedModel
from tests.engine.test_bert_parity import TEXTS
from tests.engine.test_fallback import TOKENIZER_FILES, load

PAIRS = [(TEXTS[6], text) for text in TEXTS[:8]]


def save_cross_encoder(folder):
    import transformers
    from sentence_transformers import CrossEncoder

    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        num_labels=1, architectures=["BertForSequenceClassification"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.1)
    source = folder.parent / "source"
    model.save_pretrained(source)
    for name in TOKENIZER_FILES:
        shutil.copy(resolve_model(None).path / name, source / name)
    cross_encoder = CrossEncoder(str(source), device="cpu")
    cross_encoder.save(str(folder))
    return cross_encoder


def test_a_cross_encoder_folder_scores_as_sentence_transformers_predicts(tmp_path):
    folder = tmp_path / "cross-encoder"
    cross_encoder = save_cross_encoder(folder)
    assert (
        json.loads((folder / "config_sentence_transformers.json").read_text())["model_type"] == "CrossEncoder"
    )
    spec = resolve_model(str(folder))
    assert (spec.implementation, spec.task, spec.num_labels) == ("posy", "score", 1)
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_padding()  # the bundled tokenizer.json pads to 128; the server never pads
    encoded = [tokenizer.encode(query, document) for query, document in PAIRS]
    from engine.batch import pack

    with torch.inference_mode():
        logits = load(spec)(pack([pair.ids for pair in encoded], [pair.type_ids for pair in encoded]))
    expected = torch.as_tensor(cross_encoder.predict(PAIRS)).float()
    assert (logits[:, 0].sigmoid() - expected).abs().max().item() <= 1e-4


def test_other_modules_in_a_cross_encoder_folder_are_named(tmp_path):
    folder = tmp_path / "cross-encoder"
    save_cross_encoder(folder)
    modules = json.loads((folder / "modules.json").read_text())
    kinds = {"Router": "1_Router", "LogitScore": "1_LogitScore"}
    for kind, path in kinds.items():
        module = {"idx": 1, "name": "1", "path": path, "type": f"sentence_transformers.modules.{kind}"}
        (folder / "modules.json").write_text(json.dumps([*modules, module]))
        error = {
            "Router": r"CrossEncoder modules \['Router'\] are not supported",
            "LogitScore": "a LogitScore module needs a causal LM that posy packs, not BertForSequence",
        }[kind]
        with pytest.raises(UnsupportedModel, match=error):
            resolve_model(str(folder))


def test_a_logit_score_folder_is_a_judge_of_its_two_tokens_laid_out_by_its_chat_template(tmp_path):
    from compat_tests.families import build_logit_score_reranker

    folder = tmp_path / "reranker"
    cross_encoder = build_logit_score_reranker(folder)
    spec = resolve_model(str(folder))
    assert (spec.implementation, spec.task, spec.num_labels, spec.output_dim) == ("posy", "score", 1, 1)
    assert spec.pair_format == "chat-template"
    logit_score = cross_encoder[1]
    assert spec.logit_score.token_ids == (logit_score.false_token_id, logit_score.true_token_id)
    assert spec.logit_score.chat_template.variables["add_generation_prompt"] is True
    # without its chat template a pair has no layout: a start-up error, not the tokenizer's pair template
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(UnsupportedModel, match="lays out pairs with the chat template, which it lacks"):
        resolve_model(str(folder))
