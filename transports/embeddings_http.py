"""POST /v1/embeddings on the wire (the logic is rill.openai.embeddings): JSON in, JSON out."""

from __future__ import annotations

from quart import Blueprint, Response

from rill.openai.embeddings import embed, prepare_embeddings
from rill.transports.http import traced

ENDPOINT = "/v1/embeddings"

embeddings_api = Blueprint("embeddings", __name__)


@embeddings_api.post(ENDPOINT)
async def create_embeddings() -> Response:
    async def respond(serving, trace, body):
        job = await serving.prepare(prepare_embeddings, trace, body)  # a large body in a worker thread
        return await embed(serving, job)  # a client that leaves: Serving.run's finally aborts the requests

    return await traced(ENDPOINT, "embd", respond)
