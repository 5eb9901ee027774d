"""Stored responses: what GET /v1/responses/{id}, its input_items and `previous_response_id` read.

Held in this process's memory and bounded (ResponsesConfig): finished responses are evicted past
`max_stored` (the oldest first) or `max_age_s` after they finished; runs still in flight stay (the
number of those is bounded by BackgroundRuns). An evicted, deleted or unknown id, or one another
API key stored, is a 404, as OpenAI answers. `store: false` responses never come here.

A record keeps the conversation before its turn (`prior_items`, shared with the record it
continued, not copied), its own input items and its output, so that `previous_response_id` gives the
whole conversation back in order and the next turn's prompt starts with the same tokens as this
turn's prompt and answer: the engine's prefix cache serves them.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from rill.openai.errors import ApiError
from rill.openai.responses_api.config import ResponsesConfig
from rill.openai.responses_api.event_log import EventLog

TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


@dataclass(eq=False)
class StoredResponse:
    response: dict  # the response object as GET returns it; replaced as a run progresses
    input_items: list[dict]  # this turn's input, each with an id
    prior_items: list[dict]  # the conversation before this turn (read-only: records share it)
    owner: str | None
    stored_at_s: float  # when it was put, then when it finished: its age counts from there
    background: bool = False
    log: EventLog | None = None  # background runs' events, for GET ?stream=true
    output_done: dict[int, dict] = field(default_factory=dict)  # output_index -> item, as a run goes
    done: trio.Event = field(default_factory=trio.Event)  # set when the response reaches a final status
    snapshot: Callable[[str], dict] | None = None  # a background run's object so far (BackgroundRuns)

    @property
    def id(self) -> str:
        return self.response["id"]

    @property
    def status(self) -> str | None:
        return self.response.get("status")

    @property
    def is_finished(self) -> bool:
        return self.status in TERMINAL

    def conversation(self) -> list[dict]:
        """Every item up to and including this response's output, in order."""
        return [*self.prior_items, *self.input_items, *self.response.get("output", ())]


class ResponseStore:
    def __init__(self, config: ResponsesConfig, clock: Callable[[], float] = trio.current_time):
        self.config = config
        self.clock = clock
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()  # the oldest first
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._records)

    def put(self, response: dict, *, input_items: list[dict], prior_items: list[dict], owner: str | None,
            background: bool = False, log: EventLog | None = None) -> StoredResponse:
        """Keep a response (finished, or a background run's first snapshot); evict what is past the caps."""
        record = StoredResponse(response, [with_id(item) for item in input_items], prior_items, owner,
                                self.clock(), background, log)
        self._records[record.id] = record
        if record.is_finished:
            record.done.set()
        self.evict()
        return record

    def finish(self, record: StoredResponse, response: dict) -> None:
        """A run's final object: its age starts now. A record deleted meanwhile stays deleted."""
        assert response.get("status") in TERMINAL, response.get("status")
        record.response = response
        record.stored_at_s = self.clock()
        if record.log is not None and not record.log.is_closed:
            record.log.close()
        record.done.set()
        if self._records.get(record.id) is record:
            self._records.move_to_end(record.id)
        self.evict()

    def get(self, response_id: str, owner: str | None) -> StoredResponse:
        self.evict()
        record = self._records.get(response_id)
        if record is None or record.owner != owner:
            raise ApiError(404, f"no response with id {response_id!r} is stored here (it was never stored, "
                           "was deleted, or was evicted)", param="response_id", code="response_not_found")
        return record

    def delete(self, response_id: str, owner: str | None) -> StoredResponse:
        record = self.get(response_id, owner)
        del self._records[response_id]
        return record

    def conversation(self, previous_response_id: str, owner: str | None) -> list[dict]:
        """What `previous_response_id` continues: that response's whole conversation."""
        try:
            record = self.get(previous_response_id, owner)
        except ApiError as exc:
            raise ApiError(404, f"previous response with id {previous_response_id!r} not found: it was never "
                           "stored (store: false), was deleted, or was evicted", param="previous_response_id",
                           code="previous_response_not_found") from exc
        if not record.is_finished:
            raise ApiError(400, f"previous response {previous_response_id!r} is still {record.status}; "
                           "continue it once it has finished", param="previous_response_id",
                           code="previous_response_in_progress")
        return record.conversation()

    def evict(self) -> None:
        """Finished records older than max_age_s, then the oldest finished past max_stored."""
        now, config = self.clock(), self.config
        num_finished = sum(r.is_finished for r in self._records.values())
        for response_id, record in list(self._records.items()):
            if not record.is_finished:
                continue
            if num_finished <= config.max_stored and now - record.stored_at_s <= config.max_age_s:
                break  # finished records are in the order they finished: the rest are younger
            del self._records[response_id]
            num_finished -= 1
            self.num_evicted += 1


def with_id(item: dict) -> dict:
    """The item with an `id` (OpenAI lists every input item with one): its own, or a new one."""
    if item.get("id"):
        return item
    prefix = _ID_PREFIXES.get(item.get("type") or "message", "item")
    return {"id": f"{prefix}_{secrets.token_hex(12)}", **item}


def list_page(items: list[dict], *, after: str | None, limit: int, order: str) -> dict:
    """OpenAI's list object over items (input_items): `order` "asc" or "desc", then `limit` items
    after the one whose id is `after`."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise ApiError(400, f"after: no item with id {after!r} in this response's input",
                           param="after", code="invalid_value")
        start = ids.index(after) + 1
    page = ordered[start:start + limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)}
