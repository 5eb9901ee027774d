"""Server-Sent Events framing (sans-IO): structs in, bytes out.

    data: {json}\\n\\n          one chunk
    data: [DONE]\\n\\n          the end of a stream that finished
    event: error\\ndata: {...}  a failure after the stream started (the status is already 200)
"""

from __future__ import annotations

from typing import Any

import msgspec

from rill.openai.errors import ApiError

DONE = b"data: [DONE]\n\n"
CONTENT_TYPE = "text/event-stream"


def data_frame(value: Any) -> bytes:
    return b"data: " + msgspec.json.encode(value) + b"\n\n"


def error_frame(error: ApiError) -> bytes:
    return b"event: error\n" + data_frame(error.body)
