"""Tiny random Qwen3 vs transformers, fp32 on the CPU: the causal last-token embedder (Qwen3-Embedding),
the bidirectional mean-pooled embedder (pplx-embed style), and the yes/no judge (Qwen3-Reranker) read
from two rows of the LM head; packing and batch invariance of the causal path."""

import json

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.errors import UnsupportedModel, WeightLoadError
from engine.weights import load_model

SEQLENS = [1, 2, 17, 5, 40, 3, 64, 9]
COSINE_TOLERANCE = 0.9999
LOGIT_TOLERANCE = 1e-4
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "no", "yes"]
VOCAB_SIZE = 300


def tiny_config(architecture, **overrides):
    import transformers

    settings = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        head_dim=24,  # not hidden_size / heads, as in the real Qwen3 sizes
        intermediate_size=96,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        architectures=[architecture],
    )
    settings.update(overrides)
    return transformers.Qwen3Config(**settings)


def save_random_qwen3(folder, architecture, sentence_transformers=None, std=0.1, **overrides):
    """A random checkpoint (weights of standard deviation `std`, norms around one), a word-level
    tokenizer holding Qwen's specials and the judge's yes/no, and optionally sentence-transformers
    files with the given pooling mode."""
    import transformers

    config = tiny_config(architecture, **overrides)
    torch.manual_seed(0)
    model = randomized(getattr(transformers, architecture)(config).eval(), std)
    model.save_pretrained(folder)
    save_word_tokenizer(folder)
    if sentence_transformers is not None:
        write_pooling_files(folder, sentence_transformers)
    return model


def write_pooling_files(folder, pooling_mode, hidden_size=64):
    """sentence-transformers files: the Transformer, Pooling by `pooling_mode`, Normalize."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": hidden_size, "pooling_mode": pooling_mode}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def randomized(model, std, norms=(0.5, 1.5)):
    """Norm scales drawn from `norms` (around one, as trained norms are; Gemma's (1 + w) norms store
    deltas from one); every other weight (biases too) larger than the default init, so that every one
    matters."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(*norms)
            else:
                parameter.normal_(0.0, std)
    return model


def save_word_tokenizer(folder):
    """A word-level tokenizer holding Qwen's specials and the judge's yes/no."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{index}": index for index in range(len(vocab), VOCAB_SIZE)})
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))


def random_sequences(seqlens=SEQLENS, seed=1):
    generator = torch.Generator().manual_seed(seed)
    first = len(SPECIAL_TOKENS)
    return [torch.randint(first, VOCAB_SIZE, (n,), generator=generator).tolist() for n in seqlens]


def reference_hidden(model, sequences, causal=True):
    """transformers on right-padded inputs -> the final hidden states [batch, longest, hidden]."""
    longest = max(map(len, sequences))
    input_ids = torch.zeros(len(sequences), longest, dtype=torch.int64)
    valid = torch.zeros(len(sequences), longest, dtype=torch.bool)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        valid[row, : len(ids)] = True
    encoder = model.model if hasattr(model, "model") else model
    device = next(encoder.parameters()).device
    input_ids, valid = input_ids.to(device), valid.to(device)
    # transformers reads `config.is_causal` (and each attention's flag when it skips the mask): set both,
    # and hand the bidirectional case a ready-made mask of the valid keys
    saved = getattr(encoder.config, "is_causal", True)
    encoder.config.is_causal = causal
    for layer in encoder.layers:
        layer.self_attn.is_causal = causal
    mask = valid.long() if causal else {"full_attention": valid[:, None, None, :].expand(-1, 1, longest, -1)}
    try:
        with torch.inference_mode():
            return encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
    finally:
        encoder.config.is_causal = saved
        for layer in encoder.layers:
            layer.self_attn.is_causal = True


def last_tokens(hidden, sequences):
    return torch.stack([hidden[row, len(ids) - 1] for row, ids in enumerate(sequences)])


def mean_tokens(hidden, sequences):
    return torch.stack([hidden[row, : len(ids)].mean(0) for row, ids in enumerate(sequences)])


def load(folder, **options):
    spec = resolve_model(str(folder), **options)
    return spec, load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))


def assert_same_vectors(ours, reference):
    cosine = F.cosine_similarity(ours, reference.float(), dim=-1)
    assert cosine.min().item() >= COSINE_TOLERANCE, cosine


@pytest.mark.parametrize("architecture", ["Qwen3Model", "Qwen3ForCausalLM"])
def test_causal_embedder_matches_transformers(tmp_path, architecture):
    # Qwen3-Embedding: sentence-transformers files, last-token pooling, normalized; its checkpoint may
    # be a bare Qwen3Model or carry a causal LM's head, which an embedder never reads
    reference = save_random_qwen3(tmp_path, architecture, sentence_transformers="lasttoken")
    spec, model = load(tmp_path)
    assert (spec.architecture, spec.task, spec.pooling) == ("Qwen3Model", "embed", "last")
    assert spec.normalize
    assert not spec.bidirectional and spec.max_seq_length == 128
    sequences = random_sequences()
    with torch.inference_mode():
        ours = model(pack(sequences))
    expected = F.normalize(last_tokens(reference_hidden(reference, sequences), sequences), dim=-1)
    assert_same_vectors(ours, expected)
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(sequences)), atol=1e-5)


def test_bidirectional_from_config_is_mean_pooled_without_a_causal_mask(tmp_path):
    reference = save_random_qwen3(tmp_path, "Qwen3Model", is_causal=False)
    spec, model = load(tmp_path)
    assert (spec.bidirectional, spec.pooling, spec.normalize) == (True, "mean", True)
    sequences = random_sequences()
    with torch.inference_mode():
        ours = model(pack(sequences))
    bidirectional = reference_hidden(reference, sequences, causal=False)
    expected = F.normalize(mean_tokens(bidirectional, sequences), dim=-1)
    assert_same_vectors(ours, expected)
    # and it is not what the causal model gives: the mask matters
    causal = F.normalize(mean_tokens(reference_hidden(reference, sequences, causal=True), sequences), dim=-1)
    assert F.cosine_similarity(ours, causal, dim=-1).min().item() < 0.999


def test_bidirectional_flag_uses_the_sentence_transformers_pooling(tmp_path):
    reference = save_random_qwen3(tmp_path, "Qwen3Model", sentence_transformers="mean")
    spec, model = load(tmp_path, bidirectional=True)
    assert (spec.bidirectional, spec.pooling) == (True, "mean")
    sequences = random_sequences()
    with torch.inference_mode():
        ours = model(pack(sequences))
    bidirectional = reference_hidden(reference, sequences, causal=False)
    expected = F.normalize(mean_tokens(bidirectional, sequences), dim=-1)
    assert_same_vectors(ours, expected)


@pytest.mark.parametrize("tied", [False, True])
def test_judge_logits_match_the_lm_head_rows(tmp_path, tied):
    # Qwen3-Reranker: a causal LM without sentence-transformers files; P(yes) from two rows of the head
    reference = save_random_qwen3(tmp_path, "Qwen3ForCausalLM", tie_word_embeddings=tied)
    spec, model = load(tmp_path)
    assert (spec.task, spec.pair_format, spec.num_labels) == ("score", "qwen3-judge", 2)
    sequences = random_sequences()
    with torch.inference_mode():
        ours = model(pack(sequences))
        longest = max(map(len, sequences))
        input_ids = torch.zeros(len(sequences), longest, dtype=torch.int64)
        mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(sequences):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
        logits = reference(input_ids=input_ids, attention_mask=mask).logits
    no, yes = SPECIAL_TOKENS.index("no"), SPECIAL_TOKENS.index("yes")
    expected = last_tokens(logits, sequences)[:, [no, yes]]
    assert ours.shape == (len(sequences), 2) and ours.dtype == torch.float32
    assert (ours - expected).abs().max().item() <= LOGIT_TOLERANCE


def test_last_token_pooling_reads_each_sequences_own_last_token(tmp_path):
    save_random_qwen3(tmp_path, "Qwen3Model", sentence_transformers="lasttoken")
    _, model = load(tmp_path)
    base = random_sequences([12], seed=3)[0]
    # the same text with different last tokens, and a prefix of it, packed together with others
    sequences = [base[:-1] + [10], random_sequences([7], seed=4)[0], base[:-1] + [11], base[:6]]
    with torch.inference_mode():
        packed = model(pack(sequences))
        alone = torch.cat([model(pack([ids])) for ids in sequences])
    assert_same_vectors(packed, alone)
    assert F.cosine_similarity(packed[0], packed[2], dim=0).item() < 0.999  # their last tokens differ


def test_causal_mask_does_not_cross_sequences(tmp_path):
    # under a causal mask, a sequence's prefix sees only itself: its vector from the prefix alone equals
    # the one it gets with other sequences packed before and after it
    save_random_qwen3(tmp_path, "Qwen3Model", sentence_transformers="lasttoken")
    _, model = load(tmp_path)
    others = random_sequences([30, 50], seed=5)
    target = random_sequences([20], seed=6)[0]
    with torch.inference_mode():
        packed = model(pack([others[0], target, others[1]]))[1]
        alone = model(pack([target]))[0]
    assert F.cosine_similarity(packed, alone, dim=0).item() >= COSINE_TOLERANCE


def test_a_judge_cannot_be_bidirectional(tmp_path):
    save_random_qwen3(tmp_path, "Qwen3ForCausalLM")
    with pytest.raises(UnsupportedModel, match="bidirectional"):
        resolve_model(str(tmp_path), bidirectional=True)


def test_an_unmapped_tensor_fails_the_load(tmp_path):
    from safetensors.torch import load_file, save_file

    save_random_qwen3(tmp_path, "Qwen3Model", sentence_transformers="lasttoken")
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(WeightLoadError, match="unexpected"):
        load(tmp_path)
