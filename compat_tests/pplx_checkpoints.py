"""Tiny random pplx-embed-v1 and pplx-embed-context-v1 checkpoints, laid out as the published ones are
(config PPLXQwen3Model / bidirectional_pplx_qwen3 with an auto_map to remote code, weights without a
`model.` prefix and no lm_head, sentence-transformers Pooling (mean) and st_quantize.FlexibleQuantizer, a
Qwen2 byte-level BPE tokenizer that adds no special tokens), and the reference computation: transformers'
Qwen3Model with every layer's attention non-causal under a padding-only mask, mean-pooled; a contextual
document read whole, each chunk the mean of its own tokens; the checkpoint quantizer's int8 and bits."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from compat_tests.families import (
    HIDDEN,
    MAX_POSITIONS,
    bidirectional_hidden_states,
    bidirectional_mean_vector,
    qwen3_tokenizer,
    randomize,
    write_sentence_transformers,
)

SEPARATOR = "<|endoftext|>"
QUANTIZER = {
    "idx": 2,
    "name": "2",
    "path": "",
    "type": "st_quantize.FlexibleQuantizer",
    "kwargs": ["quantization"],
}
# the reference's states of one unpadded sequence, every token attending to every token, and its vector
hidden_states = bidirectional_hidden_states
reference_vector = bidirectional_mean_vector
MODEL_CARD = (
    "---\nlibrary_name: sentence-transformers\n---\n# tiny pplx-embed\n\n| MRL | Yes |\n| Pooling | Mean |\n"
)


def pplx_config(tokenizer: Tokenizer, remote_model: str) -> dict:
    """config.json as the published checkpoints write it (a Qwen3 config under their own model type)."""
    endoftext = tokenizer.token_to_id(SEPARATOR)
    return {
        "architectures": ["PPLXQwen3Model"],
        "auto_map": {"AutoConfig": "configuration.PPLXQwen3Config", "AutoModel": f"modeling.{remote_model}"},
        "model_type": "bidirectional_pplx_qwen3",
        "use_bidirectional_attention": True,
        "use_cache": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "head_dim": 24,  # not hidden_size / heads, as in the real sizes
        "intermediate_size": 96,
        "max_position_embeddings": MAX_POSITIONS,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "vocab_size": tokenizer.get_vocab_size(),
        "bos_token_id": None,
        "eos_token_id": endoftext,
        "pad_token_id": endoftext,
    }


def build_pplx_embed(folder: Path, contextual: bool = False, seed: int = 0) -> nn.Module:
    """Write the checkpoint into `folder` (pplx-embed-context-v1's with `contextual`); returns the reference
    model on its weights: transformers' Qwen3Model, every attention non-causal, fp32."""
    import transformers
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen3_tokenizer(append_endoftext=False)
    tokenizer.save(str(folder / "tokenizer.json"))
    tokenizer_config = {
        "model_max_length": 131072,
        "tokenizer_class": "Qwen2Tokenizer",
        "pad_token": SEPARATOR,
    }
    if contextual:
        tokenizer_config["sep_token"] = SEPARATOR
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = pplx_config(tokenizer, "PPLXQwen3ContextualModel" if contextual else "PPLXQwen3Model")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed)
    model = randomize(transformers.Qwen3Model(transformers.Qwen3Config.from_dict(config)), 0.1)
    save_file(
        {name: tensor.contiguous() for name, tensor in model.state_dict().items()},
        folder / "model.safetensors",
    )
    write_sentence_transformers(folder, "mean", normalize=False)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([*modules, QUANTIZER]))
    (folder / "README.md").write_text(MODEL_CARD)
    for layer in model.layers:  # what the remote PPLXQwen3Model's post_init does
        layer.self_attn.is_causal = False
    return model.eval()


def reference_chunks(
    model: nn.Module, chunks: Sequence[Sequence[int]], separator_id: int, head: Sequence[int] = ()
) -> np.ndarray:
    """pplx-embed-context's [num_chunks, hidden]: the chunks joined by the separator (after `head`, a prompt),
    read in one pass, each chunk the mean of its own tokens' states (the separators' and the head's in
    none)."""
    joined = list(head)
    for index, chunk in enumerate(chunks):
        joined += ([separator_id] if index else []) + list(chunk)
    states = hidden_states(model, joined)
    vectors, start = [], len(head)
    for chunk in chunks:
        vectors.append(states[start : start + len(chunk)].mean(0))
        start += len(chunk) + 1
    return torch.stack(vectors).numpy()


def reference_int8(vectors: np.ndarray) -> np.ndarray:
    """st_quantize's Int8TanhQuantizer: clamp(round(tanh(x) * 127), -128, 127)."""
    rows = torch.from_numpy(np.asarray(vectors, np.float32))
    return torch.clamp(torch.round(torch.tanh(rows) * 127), -128, 127).to(torch.int8).numpy()


def reference_bits(vectors: np.ndarray) -> np.ndarray:
    """One bit a dimension, 1 where x >= 0 (the checkpoint's binary quantizer's sign)."""
    return (np.asarray(vectors) >= 0).astype(np.uint8)


def assert_same_int8(codes: np.ndarray, reference: np.ndarray, tolerance: float) -> None:
    """Codes of vectors within `tolerance` of `reference` against the reference quantizer's of `reference`:
    equal wherever round() is further than the tolerance can move it (|d tanh| <= |dx|) from a rounding
    boundary, and within one code there."""
    expected = reference_int8(reference)
    scaled = np.tanh(np.asarray(reference, np.float64)) * 127
    near = np.abs(np.abs(scaled - np.floor(scaled)) - 0.5) <= 127 * tolerance
    assert codes.shape == expected.shape and codes.dtype == np.int8
    assert (codes[~near] == expected[~near]).all()
    assert (np.abs(codes.astype(np.int16) - expected) <= 1).all()


def assert_same_bits(bits: np.ndarray, reference: np.ndarray, tolerance: float) -> None:
    """Sign bits of vectors within `tolerance` of `reference`: equal wherever |x| > tolerance."""
    expected = reference_bits(reference)
    clear = np.abs(reference) > tolerance
    assert bits.shape == expected.shape and (bits[clear] == expected[clear]).all()
