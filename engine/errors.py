"""Typed errors raised by the engine; api/errors.py maps them to HTTP."""

import math


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class Overloaded(EngineError):
    """The queue holds more tokens than max_queue_tokens allows; retry later."""

    refusal = "queue_full"  # why, in /metrics and the refusals' log (api/refusals.py)

    def __init__(self, queued_tokens: int, max_queue_tokens: int, retry_after_s: int = 1):
        super().__init__(
            f"the server queue is full ({queued_tokens} of {max_queue_tokens} tokens); retry later"
        )
        self.retry_after_s = retry_after_s


class BehindDeadline(Overloaded):
    """The work queued ahead of a request and its own would not finish within the time left to it, at
    the rate the engine measures; retry after `retry_after_s` (engine/admission.py), once the queue has
    drained (by default: by what the estimate overruns the time left)."""

    refusal = "behind_deadline"

    def __init__(self, estimate_s: float, left_s: float, retry_after_s: int | None = None):
        EngineError.__init__(
            self,
            f"the server is too busy to finish this request in time: the work queued with it takes "
            f"about {estimate_s:.1f} s, and {max(0.0, left_s):.1f} s of its --request-timeout are left; "
            "retry later",
        )
        if retry_after_s is None:
            retry_after_s = math.ceil(estimate_s - max(0.0, left_s))
        self.retry_after_s = max(1, retry_after_s)


class NeverInTime(EngineError):
    """A request whose own work, as admission estimates it (its margin included), does not fit the share of
    the request timeout that admission allows (engine/admission.py), even on an idle server: no retry
    can pass."""

    refusal = "never_in_time"

    def __init__(self, estimate_s: float, allowed_s: float, timeout_s: float, work: str = "this request"):
        super().__init__(
            f"{work} would take about {estimate_s:.1f} s on an idle server (as admission estimates it, with "
            f"the margin for this host's measured timing), more than the {allowed_s:.1f} s that admission "
            f"allows of the {timeout_s:g} s of --request-timeout; send fewer or shorter inputs, or raise "
            "--request-timeout"
        )
        self.estimate_s = estimate_s


class EngineStopped(EngineError):
    """The engine is shutting down and takes no new work."""

    refusal = "engine_stopped"


class SequenceTooLong(EngineError):
    """A sequence is longer than the batch token budget can ever hold."""


class ModelNotFound(EngineError):
    """A model id is neither a local folder nor a repository the hub (or its cache) can give."""


class UnsupportedModel(EngineError, ValueError):
    """The model's architecture, pooling or configuration is not one posy can run."""


class WeightLoadError(EngineError):
    """A checkpoint does not match the model: a missing, unexpected or misshapen tensor."""


class QuantizationUnavailable(EngineError, ValueError):
    """The asked-for quantization cannot run on this device or model."""


class AttentionBackendUnavailable(EngineError, ValueError):
    """The asked-for attention backend is unknown or cannot run on this device."""
