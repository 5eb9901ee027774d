"""rill's exceptions. Each maps to one OpenAI error shape at the HTTP edge."""

from __future__ import annotations


class RillError(Exception):
    """Base class for errors rill raises on purpose."""


class ModelLoadError(RillError):
    """A model directory is missing a file, names an unsupported architecture, or has bad shapes.

    The message names the file or config field at fault.
    """


class ValidationError(RillError, ValueError):
    """A request parameter is out of range or of the wrong type; `param` names it."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ChatTemplateError(ValidationError):
    """The chat template failed to render (including its own raise_exception calls)."""

    def __init__(self, message: str):
        super().__init__(message, param="messages", code="chat_template_error")


class TemplateRewritesTextError(ChatTemplateError):
    """The chat template does not copy a message's text verbatim exactly once, so that text cannot be
    streamed into the rendered prompt."""


class EngineDeadError(RillError):
    """The engine's worker thread died; every live and new request fails with this."""


class RankFailedError(EngineDeadError):
    """A tensor-parallel rank's process exited or failed: the engine it was part of is dead."""
