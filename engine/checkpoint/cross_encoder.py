"""sentence-transformers 6 CrossEncoder folders (`"model_type": "CrossEncoder"`): a sequence classifier
alone, or a causal LM and its LogitScore module, which scores a pair by the logit of a true token (less
that of a false one) at the last position of the model's chat template rendered with the pair as a
"query" and a "document" message."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.checkpoint.files import module_kinds, read_json
from engine.errors import UnsupportedModel

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str  # Jinja
    # what the template reads besides the messages: the special tokens, and the sentence-transformers
    # chat-template arguments (add_generation_prompt, ...)
    variables: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LogitScore:
    true_token_id: int
    false_token_id: int | None
    chat_template: ChatTemplate

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The LM head's rows the judge reads: (false, true), or (true,) alone."""
        if self.false_token_id is None:
            return (self.true_token_id,)
        return (self.false_token_id, self.true_token_id)


def read_cross_encoder(
    name: str, folder: Path, transformer_dir: Path, architecture: str, head: str, modules: list[dict]
) -> LogitScore | None:
    """The LogitScore of a causal LM's folder, None for a sequence classifier's; any other module, or a
    head that does not match the modules, is a start-up error naming them."""
    kinds = module_kinds(modules)
    others = [kind for kind in kinds if kind not in ("Transformer", "LogitScore")]
    if others:
        raise UnsupportedModel(
            f"model {name!r}: sentence-transformers CrossEncoder modules {others} are not supported"
        )
    if "LogitScore" not in kinds:
        if head != "classify":
            raise UnsupportedModel(
                f"model {name!r}: a sentence-transformers CrossEncoder needs a *ForSequenceClassification "
                f"checkpoint, not {architecture}"
            )
        return None
    if head != "judge":
        raise UnsupportedModel(
            f"model {name!r}: a LogitScore module needs a causal LM that posy packs, not {architecture}"
        )
    module = modules[kinds.index("LogitScore")]
    config = read_json(folder / module.get("path", "") / "config.json") or {}
    if config.get("module_input_name", "causal_logits") != "causal_logits" or "true_token_id" not in config:
        raise UnsupportedModel(f"model {name!r}: its LogitScore config {config} is not supported")
    template = read_chat_template(name, transformer_dir)
    return LogitScore(config["true_token_id"], config.get("false_token_id"), template)


def read_chat_template(name: str, transformer_dir: Path, purpose: str = "") -> ChatTemplate:
    """The tokenizer's chat template (chat_template.jinja, a processor's chat_template.json, or
    tokenizer_config.json's) and its variables; `purpose` says what needs it where it lacks one."""
    tokenizer_config = read_json(transformer_dir / "tokenizer_config.json") or {}
    jinja = transformer_dir / "chat_template.jinja"
    processor = read_json(transformer_dir / "chat_template.json") or {}
    source = (
        jinja.read_text()
        if jinja.is_file()
        else processor.get("chat_template") or tokenizer_config.get("chat_template")
    )
    if not isinstance(source, str):
        purpose = purpose or "its LogitScore module lays out pairs with the chat template"
        raise UnsupportedModel(f"model {name!r}: {purpose}, which it lacks")
    variables = {}
    for key in SPECIAL_TOKENS:
        token = tokenizer_config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            variables[key] = token
    st_config = read_json(transformer_dir / "sentence_bert_config.json") or {}
    arguments = (st_config.get("processing_kwargs") or {}).get("chat_template") or {}
    variables.update({key: value for key, value in arguments.items() if key != "restore_suffix"})
    return ChatTemplate(source, variables)
