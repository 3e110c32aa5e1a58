"""Typed errors of the scoring path; api/errors.py maps them to 400."""


class ScoringError(ValueError):
    """A rerank request that cannot be scored as asked."""


class QueryTooLong(ScoringError):
    def __init__(self, num_tokens: int, window: int):
        super().__init__(
            f"the query has {num_tokens} tokens and leaves no room for a document in the model's "
            f"window of {window} tokens"
        )


class TooManyChunks(ScoringError):
    def __init__(self, num_chunks: int, max_chunks: int):
        super().__init__(
            f"the documents split into {num_chunks} chunks, more than {max_chunks} a request; "
            "send fewer or shorter documents, or lower max_chunks_per_doc / max_tokens_per_doc"
        )


class TemplateError(ValueError):
    """A model's chat template that cannot lay out a (query, document) pair: a start-up error."""
