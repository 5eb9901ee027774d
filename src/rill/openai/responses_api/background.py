"""Background responses (`background: true`): runs that go on without a connection.

POST /v1/responses answers at once with the response in status "queued"; the run goes on in the
server's nursery (the app's, so a shutdown cancels it), its events go into the response's event
log (GET ?stream=true reads and follows it), and its final object into the store. At most
`max_background` run at once; past that a new one is a 429, so memory and engine load stay bounded.

Cancel (POST /v1/responses/{id}/cancel, or DELETE) cancels the run's scope: the run's `finally`
aborts its engine request, whose KV blocks are free by the end of the engine's next step, and the
response is stored with status "cancelled" and the output items finished before it. OpenAI has no
`response.cancelled` event: a follower's stream just ends, and GET shows the status.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from rill.openai.errors import ApiError
from rill.openai.responses_api.config import ResponsesConfig
from rill.openai.responses_api.event_log import EventLog
from rill.openai.responses_api.store import ResponseStore, StoredResponse

log = logging.getLogger("rill.server")

Emit = Callable[[dict], Awaitable[None]]
Run = Callable[[Emit], Awaitable[dict]]  # run_response with all but `emit` bound: the final object
Snapshot = Callable[[str], dict]  # status -> the response object as far as the run got
CANCEL_WAIT_S = 5.0  # how long a cancel waits for the run to wind down before answering


class Responses:
    """The app's Responses API state: the store and the background runs (AppState.responses)."""

    def __init__(self, config: ResponsesConfig):
        self.config = config
        self.store = ResponseStore(config)
        self.runs = BackgroundRuns(self.store, config)


class BackgroundRuns:
    def __init__(self, store: ResponseStore, config: ResponsesConfig):
        self.store = store
        self.config = config
        self._scopes: dict[str, trio.CancelScope] = {}  # response id -> its run's scope, while it runs
        self._nursery: trio.Nursery | None = None
        self.num_started = 0
        self.num_cancelled = 0

    @property
    def num_running(self) -> int:
        return len(self._scopes)

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The nursery runs start in; run it in the server's nursery. Cancelling it cancels them all."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def check_can_start(self) -> None:
        if self._nursery is None:
            raise ApiError(503, "background responses are not running on this server", code="not_ready")
        limit = self.config.max_background
        if self.num_running >= limit:
            raise ApiError(429, f"{self.num_running} background responses are running (limit {limit}, "
                           "--responses-max-background); retry once one has finished",
                           code="too_many_background_responses", headers={"Retry-After": "1"})

    def start(self, run: Run, *, initial: dict, input_items: list[dict], prior_items: list[dict],
              owner: str | None, snapshot: Snapshot | None = None) -> StoredResponse:
        """Store `initial` (status "queued") and start the run; returns at once. `snapshot(status)`
        (ResponseRun.snapshot) builds the object of a run cancelled or failed midway; without it, the
        last object the events carried with the output items that were done."""
        self.check_can_start()
        events = EventLog(self.config.max_events_per_response)
        record = self.store.put(initial, input_items=input_items, prior_items=prior_items, owner=owner,
                                background=True, log=events)
        scope = trio.CancelScope()
        self._scopes[record.id] = scope
        self.num_started += 1
        record.snapshot = snapshot or partial(_from_events, record)
        self._nursery.start_soon(self._run, record, run, scope, name=f"response {record.id}")
        return record

    async def _run(self, record: StoredResponse, run: Run, scope: trio.CancelScope) -> None:
        final = None
        try:
            with scope:
                final = await run(partial(_emit, record))
        except Exception as exc:  # noqa: BLE001 - the failure goes in the response, not the nursery
            log.error("background response %s failed", record.id, exc_info=exc)
            final = failed(record.snapshot("failed"), exc)
            record.log.append(_numbered(record.log, {"type": "response.failed", "response": final}))
        finally:
            del self._scopes[record.id]
            self.store.finish(record, final if final is not None else record.snapshot("cancelled"))

    async def cancel(self, response_id: str, owner: str | None) -> dict:
        """Cancel a background run; the stored object once it has wound down. Idempotent: a run that
        already finished (cancelled or not) answers with its final object."""
        record = self.store.get(response_id, owner)
        if not record.background:
            raise ApiError(400, "only responses created with background: true can be cancelled",
                           param="response_id", code="not_background")
        self._cancel_scope(response_id)
        with trio.move_on_after(CANCEL_WAIT_S):
            await record.done.wait()
        return record.response

    def delete(self, response_id: str, owner: str | None) -> StoredResponse:
        """Forget a response; a run in flight is cancelled first (its engine request aborted)."""
        record = self.store.delete(response_id, owner)
        self._cancel_scope(response_id)
        return record

    def _cancel_scope(self, response_id: str) -> None:
        scope = self._scopes.get(response_id)
        if scope is not None and not scope.cancel_called:
            scope.cancel()
            self.num_cancelled += 1


async def _emit(record: StoredResponse, event: dict) -> None:
    """One event of a run: into the log, and into the snapshot GET returns."""
    record.log.append(event)
    if isinstance(event.get("response"), dict):
        record.response = event["response"]
    if event.get("type") == "response.output_item.done":
        record.output_done[event["output_index"]] = event["item"]


def _from_events(record: StoredResponse, status: str) -> dict:
    """The response as far as it got: the last object an event carried, the output items done."""
    output = [record.output_done[i] for i in sorted(record.output_done)]
    return {**record.response, "status": status, "output": output}


def failed(response: dict, exc: Exception) -> dict:
    error = {"code": "server_error", "message": f"{type(exc).__name__}: {exc}"}
    return {**response, "status": "failed", "error": error}


def _numbered(events: EventLog, event: dict) -> dict:
    return {**event, "sequence_number": events.num_events}
