"""POST /v1/embeddings on the wire (the logic is rill.openai.embeddings): JSON in, JSON out."""

from __future__ import annotations

import trio
from quart import Blueprint, Response, request

from rill.openai.embeddings import embed, prepare_embeddings
from rill.transports.http import _as_api_error, _error, _json, _state

ENDPOINT = "/v1/embeddings"

embeddings_api = Blueprint("embeddings", __name__)


@embeddings_api.post(ENDPOINT)
async def create_embeddings() -> Response:
    serving = _state().serving
    trace = serving.new_trace(ENDPOINT, "embd")
    try:
        body = await request.get_data()  # past the body limit: a 413
        serving = _state().models.route_body(body)  # the model it names (404 model_not_found otherwise)
        job = await serving.prepare(prepare_embeddings, trace, body)  # a large body in a worker thread
        result = await embed(serving, job)
    except trio.Cancelled:
        serving.finish(trace, 499)  # the client left; Serving.run's finally aborted the requests
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI error body
        error = _as_api_error(exc)
        serving.finish(trace, error.status)
        return _error(error)
    serving.finish(trace, 200)
    return _json(result)
