"""Typed errors raised by the engine; api/errors.py maps them to HTTP."""


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class Overloaded(EngineError):
    """The queue holds more tokens than max_queue_tokens allows; retry later."""

    def __init__(self, queued_tokens: int, max_queue_tokens: int, retry_after_s: int = 1):
        super().__init__(
            f"the server queue is full ({queued_tokens} of {max_queue_tokens} tokens); retry later"
        )
        self.retry_after_s = retry_after_s


class EngineStopped(EngineError):
    """The engine is shutting down and takes no new work."""


class SequenceTooLong(EngineError):
    """A sequence is longer than the batch token budget can ever hold."""


class ModelNotFound(EngineError):
    """A model id is neither a local folder nor a repository the hub (or its cache) can give."""


class UnsupportedModel(EngineError, ValueError):
    """The model's architecture, pooling or configuration is not one posy can run."""


class WeightLoadError(EngineError):
    """A checkpoint does not match the model: a missing, unexpected or misshapen tensor."""


class AttentionBackendUnavailable(EngineError, ValueError):
    """The asked-for attention backend is unknown or cannot run on this device."""
