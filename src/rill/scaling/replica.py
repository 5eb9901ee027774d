"""A replica's name in the ids it hands out, so that a router sends every call to the state's owner.

`rill serve --replica-id NAME` makes the ids of state that lives in this process start with "NAME.":
streaming-input sessions (Mode B: every later call names the session in its path) and stored
responses (GET, DELETE, cancel, input_items name the response in the path). A load balancer routes a
path that names such an id by the prefix, with no table shared between replicas (rill.scaling.nginx).

Two calls name another replica's state in their body, where nginx cannot look: POST /v1/responses
with `previous_response_id` or `streaming_input.session_id`. The replica that gets one answers
307 Temporary Redirect to /_rill/replica/OWNER/v1/responses; the router sends that path to the owner
(307 keeps the method and body; the OpenAI SDKs follow it).
"""

from __future__ import annotations

import re

import msgspec

SEPARATOR = "."
NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")  # a DNS label's characters: StatefulSet pod names fit
REPLICA_PATH = "/_rill/replica/"  # REPLICA_PATH + NAME + path: the router sends path to that replica
# Set by the router on what it sent through REPLICA_PATH: that request is not redirected again (an
# owner the router does not know would otherwise bounce it back and forth).
ROUTED_HEADER = "X-Rill-Routed"


def check_name(name: str) -> str:
    """The name, or ValueError: letters, digits, '-' and '_', at most 63 (no '.', the separator)."""
    if not NAME.fullmatch(name):
        raise ValueError(f"replica name {name!r}: use 1 to 63 letters, digits, '-' or '_'")
    return name


def id_prefix(replica_id: str | None) -> str:
    """What this replica's ids start with: "NAME." ("" without --replica-id)."""
    return "" if replica_id is None else check_name(replica_id) + SEPARATOR


def owner(state_id: str) -> str | None:
    """The replica an id names ("b" for "b.sess_1f..."), or None for an id without a valid prefix."""
    name, dot, _ = state_id.partition(SEPARATOR)
    return name if dot and NAME.fullmatch(name) else None


class _Streaming(msgspec.Struct):
    session_id: str | None = None


class _BodyIds(msgspec.Struct):
    """The ids a POST /v1/responses body may name (everything else in it is ignored here)."""

    previous_response_id: str | None = None
    streaming_input: _Streaming | None = None


def redirect_for(replica_id: str | None, body: bytes, path: str, routed: bool = False) -> str | None:
    """Where a body naming another replica's state should go (REPLICA_PATH + owner + path), or None
    when it names none, names this replica's, does not decode (the handler reports that), or the
    router already sent it to the owner it named (`routed`)."""
    if replica_id is None or routed:
        return None
    try:
        ids = msgspec.json.decode(body, type=_BodyIds)
    except msgspec.DecodeError:
        return None
    named = [ids.previous_response_id, ids.streaming_input and ids.streaming_input.session_id]
    owners = {owner(i) for i in named if isinstance(i, str)} - {None, replica_id}
    return REPLICA_PATH + owners.pop() + path if len(owners) == 1 else None
