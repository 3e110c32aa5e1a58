"""The baseline: HF transformers in process, the way sentence-transformers and the model cards run it
(SDPA attention, length-sorted padded batches, pooling on the device, results on the host)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.checkpoints import Checkpoint

DEFAULT_BATCH_SIZE = 32  # sentence-transformers' default
JUDGE_TOKENS = ("no", "yes")


class Baseline:
    def __init__(self, checkpoint: Checkpoint, device: str, dtype, batch_size: int = DEFAULT_BATCH_SIZE):
        from tokenizers import Tokenizer

        self.checkpoint = checkpoint
        self.device = device
        self.batch_size = batch_size
        # loaded in `dtype` as sentence-transformers loads it (not the shared reference cast in place: a
        # cast rounds the rotary frequencies too, which from_pretrained keeps in float32)
        architecture = type(checkpoint.reference)
        self.model = architecture.from_pretrained(checkpoint.folder, dtype=dtype).to(device).eval()
        self.dense = [weight.to(device) for weight in checkpoint.dense]
        self.tokenizer = Tokenizer.from_file(str(checkpoint.folder / "tokenizer.json"))
        self.judge_ids = [self.tokenizer.token_to_id(token) for token in JUDGE_TOKENS]
        self.pad_id = getattr(self.model.config, "pad_token_id", None) or 0  # as a tokenizer pads

    def to(self, dtype) -> Baseline:
        """The same weights computed in `dtype`; rotary frequencies stay float32, as loading gives them."""
        import torch

        kept = {name: buffer for name, buffer in self.model.named_buffers() if name.endswith("inv_freq")}
        self.model.to(dtype)
        for name, buffer in kept.items():
            module_name, _, buffer_name = name.rpartition(".")
            self.model.get_submodule(module_name).register_buffer(
                buffer_name, buffer.to(torch.float32), persistent=False
            )
        return self

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with the tokenizer's special tokens, as the model's own tokenizer gives them."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Texts to normalized vectors, tokenization included (sentence-transformers' encode)."""
        return self.embed_ids(self.encode(texts))

    def embed_ids(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """[n, out] float32 normalized vectors: the checkpoint's pooling (mean, or the last token as
        Qwen3-Embedding's), then its Dense modules (EmbeddingGemma's) in float32."""
        import torch

        def pool(output, mask, lengths):
            hidden = output.last_hidden_state.float()
            if self.checkpoint.pooling == "lasttoken":
                pooled = hidden[torch.arange(len(lengths), device=hidden.device), lengths - 1]
            elif self.checkpoint.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                pooled = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
            for weight in self.dense:
                pooled = pooled @ weight.T
            return pooled

        rows = self._batched(sequences, None, pool)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    def score_ids(
        self, sequences: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]] | None = None
    ) -> np.ndarray:
        """[n] relevance in [0, 1]: the sigmoid of a cross-encoder's logit, or a judge's P("yes") from
        the full LM head at each row's last token, as Qwen3-Reranker's model card computes it."""
        import torch

        def pool(output, mask, lengths):
            logits = output.logits  # rows picked before any float32 copy of a vocabulary-wide tensor
            if self.checkpoint.kind == "judge":
                last = logits[torch.arange(len(lengths), device=logits.device), lengths - 1]
                return last[:, self.judge_ids].float().softmax(-1)[:, 1:]
            return logits[:, :1].float().sigmoid()

        return self._batched(sequences, token_type_ids, pool)[:, 0]

    def _batched(self, sequences, token_type_ids, pool) -> np.ndarray:
        import torch

        order = sorted(range(len(sequences)), key=lambda index: len(sequences[index]))
        rows: dict[int, np.ndarray] = {}
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                lengths = torch.tensor([len(sequences[index]) for index in chunk])
                ids = torch.full((len(chunk), int(lengths.max())), self.pad_id, dtype=torch.int64)
                types = torch.zeros_like(ids)
                mask = torch.zeros_like(ids)
                for row, index in enumerate(chunk):
                    ids[row, : lengths[row]] = torch.tensor(sequences[index])
                    mask[row, : lengths[row]] = 1
                    if token_type_ids is not None:
                        types[row, : lengths[row]] = torch.tensor(token_type_ids[index])
                inputs = {"input_ids": ids, "attention_mask": mask}
                if token_type_ids is not None:
                    inputs["token_type_ids"] = types
                inputs = {name: tensor.to(self.device, non_blocking=True) for name, tensor in inputs.items()}
                output = self._forward(inputs)
                pooled = pool(output, inputs["attention_mask"], lengths.to(self.device))
                rows.update(zip(chunk, pooled.float().cpu().numpy()))
        return np.stack([rows[index] for index in range(len(sequences))])

    def _forward(self, inputs: dict):
        """The model on a padded batch; a bidirectional decoder (pplx-embed) with every layer's causal flag
        off and a mask of the valid keys, as its modeling code runs it."""
        if self.checkpoint.causal:
            return self.model(**inputs)
        model = self.model
        model.config.is_causal = False
        for layer in model.layers:
            layer.self_attn.is_causal = False
        valid = inputs["attention_mask"].bool()
        mask = {"full_attention": valid[:, None, None, :].expand(-1, 1, valid.shape[1], -1)}
        return model(input_ids=inputs["input_ids"], attention_mask=mask)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
