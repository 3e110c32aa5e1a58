"""Random-weight dual encoders (CLIP, SigLIP) saved as transformers saves them, with a tokenizer and a
processor config: tiny ones for the CPU parity tests, real-size ones for the images suite. No download."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.token_checkpoints import LISTWISE_CORPUS, NOISE_STD

TINY_TOWER = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4}
# openai/clip-vit-base-patch16's and google/siglip-base-patch16-224's shapes
BASE_TEXT = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 8}
BASE_VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
}
SIGLIP_BASE_TEXT = {**BASE_VISION}
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def clip_tokenizer(
    specials: tuple[str, ...], template: str, vocab_size: int = 300, corpus: str = LISTWISE_CORPUS
):
    """A byte-level BPE tokenizer trained on a small corpus, its template (the texts' special tokens) as the
    model's: CLIP's start and end of text, SigLIP's end of sequence."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([corpus], trainer)
    special_ids = [(token, tokenizer.token_to_id(token)) for token in specials]
    tokenizer.post_processor = processors.TemplateProcessing(single=template, special_tokens=special_ids)
    return tokenizer


def randomized(model: torch.nn.Module, seed: int, std: float) -> torch.nn.Module:
    """Every parameter noise, norm scales around 1, so that parity can fail on any of them."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * std
            is_norm_scale = ("norm" in name or "layernorm" in name) and name.endswith("weight")
            parameter.copy_(1 + noise if is_norm_scale else noise)
    return model.eval()


def dual_encoder_checkpoint(
    folder: Path,
    kind: str,
    text=TINY_TOWER,
    vision=TINY_TOWER,
    image_size: int = 32,
    patch_size: int = 8,
    projection_dim: int = 24,
    seed: int = 0,
    std: float = NOISE_STD,
):
    """A random `kind` ("clip", "siglip", or "siglip2": NaFlex, any size up to `image_size` squared's
    patches, its position table of those) checkpoint in `folder` -> (folder, the transformers model)."""
    from transformers import CLIPConfig, CLIPModel, Siglip2Config, Siglip2Model, SiglipConfig, SiglipModel

    folder.mkdir(parents=True, exist_ok=True)
    if kind == "clip":
        tokenizer = clip_tokenizer(("<|startoftext|>", "<|endoftext|>"), "<|startoftext|> $A <|endoftext|>")
        eos = tokenizer.token_to_id("<|endoftext|>")
        bos = tokenizer.token_to_id("<|startoftext|>")
        text_config = {
            **text, "vocab_size": tokenizer.get_vocab_size(), "max_position_embeddings": 77,
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos,
        }  # fmt: skip
        config = CLIPConfig(
            text_config=text_config,
            vision_config={**vision, "image_size": image_size, "patch_size": patch_size},
            projection_dim=projection_dim,
        )
        model_class, processor = CLIPModel, {
            "image_processor_type": "CLIPImageProcessor", "do_resize": True,
            "size": {"shortest_edge": image_size},
            "do_center_crop": True, "crop_size": {"height": image_size, "width": image_size}, "resample": 3,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": CLIP_MEAN,
            "image_std": CLIP_STD, "do_convert_rgb": True,
        }  # fmt: skip
    else:
        tokenizer = clip_tokenizer(("<pad>", "</s>", "<unk>"), "$A </s>")
        text_config = {
            **text, "vocab_size": tokenizer.get_vocab_size(), "max_position_embeddings": 64,
            "pad_token_id": tokenizer.token_to_id("<pad>"), "eos_token_id": tokenizer.token_to_id("</s>"),
            "projection_size": vision["hidden_size"],
        }  # fmt: skip
        if kind == "siglip2":
            num_patches = (image_size // patch_size) ** 2
            config = Siglip2Config(
                text_config=text_config,
                vision_config={**vision, "num_patches": num_patches, "patch_size": patch_size},
            )
            model_class, processor = Siglip2Model, {
                "image_processor_type": "Siglip2ImageProcessor", "do_resize": True, "patch_size": patch_size,
                "max_num_patches": num_patches, "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255,
                "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
            }  # fmt: skip
        else:
            config = SiglipConfig(
                text_config=text_config,
                vision_config={**vision, "image_size": image_size, "patch_size": patch_size},
            )
            model_class, processor = SiglipModel, {
                "image_processor_type": "SiglipImageProcessor", "do_resize": True,
                "size": {"height": image_size, "width": image_size}, "resample": 3, "do_rescale": True,
                "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3,
            }  # fmt: skip
    config.architectures = [model_class.__name__]
    torch.manual_seed(seed)
    model = randomized(model_class(config), seed, std)
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": QWEN2_VL_CHAT_TEMPLATE}))
    return folder, model


QWEN2_VL_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
    "<|video_pad|>",
)  # fmt: skip
# Qwen2-VL's chat layout: a default system turn, each image part its vision tokens, the assistant's prompt
QWEN2_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_QWEN2_VL_TEXT = {
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512,
}  # fmt: skip
# head_dim 16 (64 / 4 heads): its 8 rotary frequencies turn by the temporal, height and width positions
TINY_MROPE_SECTION = [2, 3, 3]
TINY_QWEN2_VL_VISION = {"depth": 2, "embed_dim": 32, "num_heads": 4, "mlp_ratio": 2}
# Qwen3-VL's names; a 4x4 learned position table, both blocks' states added to the decoder (DeepStack)
TINY_QWEN3_VL_VISION = {
    "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "num_position_embeddings": 16,
    "deepstack_visual_indexes": [0, 1], "hidden_act": "gelu_pytorch_tanh",
}  # fmt: skip


def vision_language_checkpoint(
    folder: Path,
    text=TINY_QWEN2_VL_TEXT,
    vision=None,
    mrope_section=TINY_MROPE_SECTION,
    pixel_range: tuple[int, int] | None = None,
    seed: int = 0,
    std: float = NOISE_STD,
    dtype: torch.dtype = torch.float32,
    kind: str = "qwen2_vl",
    words: tuple[str, ...] = (),
    tied: bool = False,
    corpus: str = LISTWISE_CORPUS,
):
    """A random Qwen2-VL (Qwen2VLForConditionalGeneration, as gme-Qwen2-VL ships) or, `kind` "qwen3_vl",
    Qwen3-VL in `folder`, with a tokenizer trained on `corpus` holding its vision tokens (and `words`, each
    one token) and a
    processor config of `pixel_range`, its weights saved in `dtype`, its LM head `tied` to its embeddings
    or its own -> (folder, the model in float32, of those weights)."""
    import transformers

    qwen3 = kind == "qwen3_vl"
    prefix = "Qwen3VL" if qwen3 else "Qwen2VL"
    config_class = getattr(transformers, f"{prefix}Config")
    model_class = getattr(transformers, f"{prefix}ForConditionalGeneration")
    patch = 16 if qwen3 else 14
    vision = vision or (TINY_QWEN3_VL_VISION if qwen3 else TINY_QWEN2_VL_VISION)
    pixel_range = pixel_range or ((2 * patch) ** 2 * 4, (2 * patch) ** 2 * 16)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = clip_tokenizer(QWEN2_VL_SPECIALS, "$A", corpus=corpus)
    tokenizer.add_tokens(list(words))
    ids = {token: tokenizer.token_to_id(token) for token in QWEN2_VL_SPECIALS}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(mrope_section)}
    out = {"out_hidden_size": text["hidden_size"]} if qwen3 else {"hidden_size": text["hidden_size"]}
    head_dim = {"head_dim": text["hidden_size"] // text["num_attention_heads"]} if qwen3 else {}
    config = config_class(
        text_config={**text, **head_dim, "vocab_size": tokenizer.get_vocab_size(), "rope_parameters": rope},
        vision_config={**vision, **out, "patch_size": patch},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=tied,
    )
    config.architectures = [model_class.__name__]
    torch.manual_seed(seed)
    model = randomized(model_class(config), seed, std).to(dtype)
    model.save_pretrained(folder)
    model = model.float()
    tokenizer.save(str(folder / "tokenizer.json"))
    processor = {
        "image_processor_type": "Qwen2VLImageProcessor", "min_pixels": pixel_range[0],
        "max_pixels": pixel_range[1], "patch_size": patch, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.5] * 3 if qwen3 else CLIP_MEAN, "image_std": [0.5] * 3 if qwen3 else CLIP_STD,
        "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "do_resize": True, "resample": 3, "do_convert_rgb": True,
    }  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": QWEN2_VL_CHAT_TEMPLATE}))
    return folder, model


def jina_ranker_checkpoint(folder: Path, seed: int = 0, std: float = NOISE_STD, **shape):
    """A random jina-reranker-m0 in `folder`: a tiny Qwen2-VL (or of `shape`: vision_language_checkpoint's
    text, vision and mrope_section) whose LM head is gone, its `score` MLP (dense, ReLU, one logit) beside
    it, as the checkpoint names them, its config's architecture JinaVLForRanking -> (folder, the Qwen2-VL
    model in float32, the score MLP)."""
    from safetensors.torch import load_file, save_file
    from torch import nn

    folder, model = vision_language_checkpoint(folder, seed=seed, std=std, **shape)
    hidden = model.config.text_config.hidden_size
    mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    score = randomized(mlp, seed + 1, std)
    weights = load_file(folder / "model.safetensors")
    weights.pop("lm_head.weight", None)
    weights.update({f"score.{name}": value.contiguous() for name, value in score.state_dict().items()})
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["JinaVLForRanking"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder, model, score


def qwen3_vl_judge_checkpoint(folder: Path, tied: bool, seed: int = 0, std: float = NOISE_STD, **shape):
    """A random Qwen3-VL-Reranker in `folder`: a tiny Qwen3VLForConditionalGeneration whose model card files
    it under text ranking, its tokenizer holding "yes" and "no" and merging ">:(" as a real one would (where
    the judge's layout meets a document that starts with a parenthesis), its LM head `tied` to its
    embeddings or its own; tiny, or of `shape` (vision_language_checkpoint's text, vision and mrope_section)
    -> (folder, the model in float32)."""
    corpus = LISTWISE_CORPUS + " <Document>:(a" * 200
    folder, model = vision_language_checkpoint(
        folder, seed=seed, std=std, kind="qwen3_vl", words=("yes", "no"), tied=tied, corpus=corpus, **shape
    )
    card = "---\nlicense: apache-2.0\npipeline_tag: text-ranking\n---\n# A random Qwen3-VL-Reranker\n"
    (folder / "README.md").write_text(card)
    return folder, model


def colqwen2_checkpoint(folder: Path, seed: int = 0, std: float = NOISE_STD, dim: int = 16, **shape):
    """A random ColQwen2 in `folder`, as transformers' ColQwen2ForRetrieval saves it (its config wrapping a
    tiny Qwen2-VL's, or one of `shape`, as vlm_config; the Qwen2-VL under "vlm."; `embedding_proj_layer`
    to `dim`) -> (folder, the Qwen2-VL model in float32, the projection)."""
    from transformers import ColQwen2Config, ColQwen2ForRetrieval

    folder, model = vision_language_checkpoint(folder, seed=seed, std=std, **shape)
    config = ColQwen2Config(vlm_config=model.config.to_dict(), embedding_dim=dim)
    config.architectures = ["ColQwen2ForRetrieval"]
    retriever = ColQwen2ForRetrieval(config).eval()
    retriever.vlm.load_state_dict(model.model.state_dict())
    randomized(retriever.embedding_proj_layer, seed + 1, std)
    (folder / "model.safetensors").unlink()
    retriever.save_pretrained(folder)
    return folder, model, retriever.embedding_proj_layer


PALIGEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<image>")
# multi-query attention, as PaliGemma-3B's Gemma has it
TINY_PALIGEMMA_TEXT = {
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 512,
}  # fmt: skip
TINY_PALIGEMMA_VISION = {**TINY_TOWER, "image_size": 56, "patch_size": 14}


def colpali_checkpoint(
    folder: Path,
    text=TINY_PALIGEMMA_TEXT,
    vision=TINY_PALIGEMMA_VISION,
    seed: int = 0,
    std: float = NOISE_STD,
    dim: int = 16,
    dtype: torch.dtype = torch.float32,
):
    """A random ColPali in `folder`, as transformers' ColPaliForRetrieval saves it: a PaliGemma (a tiny
    one, or of `text` and `vision`) under "vlm.", `embedding_proj_layer` to `dim`, its weights in `dtype`; a
    tokenizer whose template adds <bos> (ColPali's processor turns it off and writes its own) and a SigLIP
    image processor -> (folder, the model in float32)."""
    from transformers import ColPaliConfig, ColPaliForRetrieval, PaliGemmaConfig

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = clip_tokenizer(PALIGEMMA_SPECIALS, "<bos> $A")
    ids = {token: tokenizer.token_to_id(token) for token in PALIGEMMA_SPECIALS}
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    vlm = PaliGemmaConfig(
        text_config={
            **text, "model_type": "gemma", "vocab_size": tokenizer.get_vocab_size(),
            "hidden_activation": "gelu_pytorch_tanh", "pad_token_id": ids["<pad>"],
            "bos_token_id": ids["<bos>"], "eos_token_id": ids["<eos>"],
        },
        vision_config={**vision, "model_type": "siglip_vision_model", "vision_use_head": False},
        image_token_index=ids["<image>"],
        projection_dim=text["hidden_size"],
        hidden_size=text["hidden_size"],
    )  # fmt: skip
    config = ColPaliConfig(vlm_config=vlm.to_dict(), embedding_dim=dim)
    config.architectures = ["ColPaliForRetrieval"]
    torch.manual_seed(seed)
    model = randomized(ColPaliForRetrieval(config), seed, std).to(dtype)
    model.save_pretrained(folder)
    model = model.float()
    tokenizer.save(str(folder / "tokenizer.json"))
    specials = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials))
    processor = {
        "image_processor_type": "SiglipImageProcessor", "do_resize": True,
        "size": {"height": vision["image_size"], "width": vision["image_size"]}, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3, "image_seq_length": patches, "processor_class": "ColPaliProcessor",
    }  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return folder, model


# ColPaliProcessor's text of a query and of an image document (its <bos> written, the tokenizer's turned off)
COLPALI_QUERY = "<bos>Question: {}" + "<pad>" * 10 + "\n"
COLPALI_IMAGE = "{}<bos>Describe the image.\n"


def colpali_vectors(model, folder: Path, items) -> list:
    """transformers' ColPali token vectors ([tokens, dim] float32 arrays) of each item, a text laid out as a
    query, PNG bytes as an image document, a list the token ids of a text laid out already, each run alone
    as ColPaliProcessor gives it (token_type_ids of zeros: every token attends to every other)."""
    import io

    from PIL import Image
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    processor = AutoImageProcessor.from_pretrained(folder)
    vectors = []
    for item in items:
        inputs = {}
        if isinstance(item, str):
            text = COLPALI_QUERY.format(item)
        elif isinstance(item, bytes):
            pixels = processor(images=[Image.open(io.BytesIO(item)).convert("RGB")], return_tensors="pt")
            inputs["pixel_values"] = pixels["pixel_values"]
            text = COLPALI_IMAGE.format("<image>" * processor.image_seq_length)
        ids = torch.tensor(
            [item if isinstance(item, list) else tokenizer.encode(text, add_special_tokens=False).ids]
        )
        with torch.inference_mode():
            output = model(input_ids=ids, token_type_ids=torch.zeros_like(ids), **inputs)
        vectors.append(output.embeddings[0].numpy())
    return vectors


# each input as those embedders lay it out: gme-Qwen2-VL's (the chat template's default system turn) and
# Qwen3-VL-Embedding's (its own instruction), <|endoftext|> pooled
EMBEDDER_LAYOUT = (
    "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{{}}<|im_end|>\n<|im_start|>assistant\n<|endoftext|>"
)
EMBEDDER_LAYOUTS = {
    "qwen2_vl": EMBEDDER_LAYOUT.format("You are a helpful assistant."),
    "qwen3_vl": EMBEDDER_LAYOUT.format("Represent the user's input."),
}


def image_part(processor, data: bytes, inputs: dict) -> str:
    """A PNG as a Qwen2-VL processor gives it to the model: its pixels and grid appended to `inputs`'
    (after any image before it in the text), and its vision tokens' text, a placeholder a merged patch."""
    import io

    from PIL import Image

    pixels = processor(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
    for key in ("pixel_values", "image_grid_thw"):
        inputs[key] = torch.cat([inputs[key], pixels[key]]) if key in inputs else pixels[key]
    pads = "<|image_pad|>" * int(pixels["image_grid_thw"].prod() // 4)
    return f"<|vision_start|>{pads}<|vision_end|>"


def embedder_vectors(model, folder: Path, layout: str, texts=(), images=(), fused=()):
    """transformers' normalized last-token rows of `layout` (EMBEDDER_LAYOUTS) around each text, each PNG
    (its processor's pixels and grid, a placeholder for each merged patch) and each tuple of PNGs and
    texts of `fused` (its parts in order, in one user turn), in that order."""
    import torch.nn.functional as F
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    processor = AutoImageProcessor.from_pretrained(folder)
    inputs = [{"text": layout.format(text)} for text in texts]
    for parts in [*((data,) for data in images), *fused]:
        one: dict = {}
        text = "".join(part if isinstance(part, str) else image_part(processor, part, one) for part in parts)
        inputs.append({"text": layout.format(text), **one})
    rows = []
    for one in inputs:
        ids = torch.tensor([tokenizer.encode(one.pop("text"), add_special_tokens=False).ids])
        if one:
            one["mm_token_type_ids"] = (ids == model.config.image_token_id).int()
        with torch.inference_mode():
            rows.append(F.normalize(model.model(input_ids=ids, **one).last_hidden_state[0, -1], dim=-1))
    return torch.stack(rows).numpy()
