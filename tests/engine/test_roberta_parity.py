"""Tiny random RoBERTa, XLM-RoBERTa and CamemBERT vs transformers: mean-pooled vectors and logits, fp32."""

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.weights import load_model

SEQLENS = [2, 17, 5, 40, 1 + 2, 64, 9]  # with <s> and </s>; 64 is the window
LOGIT_TOLERANCE = 1e-4
COSINE_TOLERANCE = 0.9999
PREFIXES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"}


def tiny_config(family, architecture, num_labels=1):
    import transformers

    config_classes = {
        "roberta": transformers.RobertaConfig,
        "xlm-roberta": transformers.XLMRobertaConfig,
        "camembert": transformers.CamembertConfig,
    }
    return config_classes[family](
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64 + 2,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        num_labels=num_labels,
        architectures=[architecture],
    )


def save_random_model(folder, model_class, config, std=0.2):
    """std None keeps transformers' init (real-size shapes, which larger weights saturate)."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for parameter in model.parameters() if std is not None else ():
            parameter.normal_(0.0, std)  # larger than the default init, so every weight matters
    model.save_pretrained(folder)
    # the loader wants a fast tokenizer file next to the weights; its vocabulary plays no part here
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    return model


def random_sequences(seqlens=SEQLENS, seed=1):
    generator = torch.Generator().manual_seed(seed)
    # <s> ... </s>, never the pad id 1 inside
    return [[0, *torch.randint(3, 1000, (n - 2,), generator=generator).tolist(), 2] for n in seqlens]


def padded(sequences):
    input_ids = torch.ones(len(sequences), max(map(len, sequences)), dtype=torch.int64)  # pad id 1
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "camembert"])
def test_encoder_matches_transformers(tmp_path, family):
    import transformers

    prefix = PREFIXES[family]
    reference = save_random_model(
        tmp_path, getattr(transformers, f"{prefix}Model"), tiny_config(family, f"{prefix}Model")
    )
    spec = resolve_model(str(tmp_path))
    assert (spec.task, spec.pooling, spec.normalize, spec.max_seq_length) == ("embed", "mean", True, 64)
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    sequences = random_sequences()
    input_ids, attention_mask = padded(sequences)
    with torch.inference_mode():
        ours = model(pack(sequences))
        hidden = reference(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    mask = attention_mask.unsqueeze(-1).float()
    expected = F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert F.cosine_similarity(ours, expected).min().item() >= COSINE_TOLERANCE


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "camembert"])
def test_classifier_matches_transformers(tmp_path, family):
    import transformers

    prefix = PREFIXES[family]
    architecture = f"{prefix}ForSequenceClassification"
    config = tiny_config(family, architecture, num_labels=3)
    reference = save_random_model(tmp_path, getattr(transformers, architecture), config)
    spec = resolve_model(str(tmp_path))
    assert (spec.task, spec.num_labels, spec.output_dim) == ("score", 3, 3)
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    sequences = random_sequences()
    input_ids, attention_mask = padded(sequences)
    with torch.inference_mode():
        ours = model(pack(sequences))
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    assert ours.shape == (len(SEQLENS), 3)
    assert (ours - expected).abs().max().item() <= LOGIT_TOLERANCE
