"""Which served model a realtime connection talks to, when a server serves several.

The model is chosen by `?model=` on the URL (the driver), or by `session.update`'s model (as
OpenAI's clients send it) while the connection is still fresh: nothing in its conversation, no
engine request made, no frame feed. After that the conversation's tokens, KV and frames belong
to one engine, so a different model is refused with an error event (the connection goes on);
naming the model it already uses is always fine. A speech model's name is not a switch: it makes
a transcription session (conversation.Settings.update).
"""

from __future__ import annotations

from collections.abc import Callable

from rill.openai.serving import Serving
from rill.transports.realtime.events import RealtimeError
from rill.transports.realtime.model_names import is_openai_realtime_model
from rill.transports.realtime.state import State

ServingFor = Callable[[str], Serving]  # rill.openai.served_models.ServedModels.serving_for


def serving_named(conn, name: str | None, speech_models: tuple[str, ...]) -> Serving:
    """The Serving a session.update's model names: the connection's own unless another served model
    is named (404 model_not_found as ServedModels says it for a name no model has)."""
    if (name is None or name in speech_models or name in conn.serving.model_names or conn.serving_for is None
            or is_openai_realtime_model(name)):
        return conn.serving  # Settings.update checks the name against it, as with one model
    serving = conn.serving_for(name)
    if serving is not conn.serving and not is_fresh(conn):
        raise RealtimeError("invalid_value", f"this connection talks to {conn.serving.model_names[0]!r} already; "
                            f"the model is chosen before the conversation starts: open a connection with "
                            f"?model={name}", "session.model")
    return serving


def is_fresh(conn) -> bool:
    return (conn.state is State.IDLE and not conn.conversation.items and conn.num_requests == 0
            and conn.video.feed is None and not conn.video.media)


def use(conn, serving: Serving) -> None:
    """Point a fresh connection at another model: its Serving, its engine, its picture/video framing."""
    from rill.transports.realtime.video import VideoInput

    conn.serving = serving
    conn.engine.use(serving.engine)
    conn.video = VideoInput(conn, conn.video.link)
