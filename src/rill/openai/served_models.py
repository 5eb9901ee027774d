"""The models one server serves: served name -> Serving, and which one a request names.

`rill serve --model A --model B` runs one engine per model (own worker thread, own KV cache) and
one `Serving` over each. Every route that reads a request's `model` asks `serving_for(name)`: no
name is the first model (the default), a served name its model, any other name the OpenAI 404
`model_not_found` that lists every name (with one model, word for word what
`Serving.check_model` says). The route then runs the request on that Serving alone, so its
checks, tokenizer, vision processor and engine are the named model's.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from rill.openai.chat_bodies import ModelCard
from rill.openai.errors import ApiError
from rill.openai.serving import Serving


class _Named(msgspec.Struct):
    """The one field routing reads; every other field is skipped unparsed."""

    model: str | None = None


def requested_model(body: bytes) -> str | None:
    """The `model` of a JSON body, or None when it names none or the body is not one we can read:
    the default model's own decode then answers the 400 (bad JSON, a model that is not a string)."""
    try:
        return msgspec.json.decode(body, type=_Named).model
    except (msgspec.MsgspecError, RecursionError):
        return None


class ServedModels:
    """Served names -> Servings, in the order given; the first Serving is the default."""

    def __init__(self, servings: list[Serving]):
        if not servings:
            raise ValueError("a server serves at least one model")
        self.servings = list(servings)
        self._by_name: dict[str, Serving] = {}
        for serving in self.servings:
            for name in serving.model_names:
                if name in self._by_name:
                    raise ValueError(f"two models are served as {name!r}; give them different names (NAME=DIR)")
                self._by_name[name] = serving

    @property
    def default(self) -> Serving:
        return self.servings[0]

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    @property
    def is_multi(self) -> bool:
        return len(self.servings) > 1

    def __iter__(self) -> Iterator[Serving]:
        return iter(self.servings)

    def serving_for(self, name: str | None) -> Serving:
        """The Serving of a served name; None: the default; else 404 model_not_found."""
        if name is None:
            return self.default
        serving = self._by_name.get(name)
        if serving is None:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {self.names}",
                           param="model", code="model_not_found")
        return serving

    def route(self, name: str | None) -> Serving:
        """The Serving a request runs on before its own checks: with one model always that one (whose
        check_model answers a wrong name as it always did, after the body's other checks), with several
        the one named (serving_for)."""
        return self.serving_for(name) if self.is_multi else self.default

    def route_body(self, body: bytes) -> Serving:
        """route() for a JSON body not decoded yet (one model: not even peeked at)."""
        return self.serving_for(requested_model(body)) if self.is_multi else self.default

    def model_cards(self) -> list[ModelCard]:
        """GET /v1/models: every model's cards, default first."""
        return [card for serving in self.servings for card in serving.model_cards()]

    def model_card(self, name: str) -> ModelCard:
        return self.serving_for(name).model_card(name)

    @property
    def all_alive(self) -> bool:
        return all(serving.engine.is_alive for serving in self.servings)

    def first_dead(self) -> Serving | None:
        return next((s for s in self.servings if not s.engine.is_alive), None)
