"""WS /v1/audio/speech/stream against a real server: text in pieces in, each clause's audio out as soon as
the clause is complete (before input.done), vLLM-Omni's events around it; limits at and past; errors as
error events; refusals at the upgrade in OpenAI's error shape."""

from __future__ import annotations

import json

import pytest
from trio_websocket import ConnectionRejected, open_websocket_url

from helpers_server import running_server
from rill.assets import RILL_TINY_DIR

PATH = "/v1/audio/speech/stream"


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + PATH


async def test_a_server_without_a_voice_refuses_the_upgrade_with_404():
    async with running_server(RILL_TINY_DIR) as server:
        with pytest.raises(ConnectionRejected) as caught:
            async with open_websocket_url(ws_url(server)):
                pass
        assert caught.value.status_code == 404
        assert json.loads(caught.value.body)["error"]["code"] == "model_not_found"
