"""The Responses API's store, event log and background runs without a server or an engine.

Runs are driven by a fault-injection driver (`ScriptedRun`, a stand-in for run_response that emits
a script of events, can be held mid-run, and can fail), so that every order of events, readers,
cancels and evictions can be pinned exactly."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rill.openai.errors import ApiError
from rill.openai.responses_api.background import BackgroundRuns
from rill.openai.responses_api.config import ResponsesConfig
from rill.openai.responses_api.event_log import EventLog, EventsDropped
from rill.openai.responses_api.store import ResponseStore, list_page, with_id

USER = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


class FakeClock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def response(response_id: str, status: str = "completed", output=()) -> dict:
    return {"id": response_id, "object": "response", "status": status, "output": list(output)}


def message(text: str) -> dict:
    return {"type": "message", "id": f"msg_{text}", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}


def store(clock=None, **limits) -> ResponseStore:
    return ResponseStore(ResponsesConfig(**limits), clock or FakeClock())


def put(s: ResponseStore, response_id: str, status: str = "completed", owner=None, prior=()):
    return s.put(response(response_id, status), input_items=USER, prior_items=list(prior), owner=owner)


# -- the store ----------------------------------------------------------------------------------------------


def test_get_returns_what_was_put_and_other_owners_get_404():
    s = store()
    put(s, "resp_a", owner="key1")
    assert s.get("resp_a", "key1").response["id"] == "resp_a"
    with pytest.raises(ApiError) as err:
        s.get("resp_a", "key2")
    assert (err.value.status, err.value.code) == (404, "response_not_found")


def test_delete_makes_the_id_404():
    s = store()
    put(s, "resp_a")
    s.delete("resp_a", None)
    with pytest.raises(ApiError) as err:
        s.get("resp_a", None)
    assert err.value.status == 404


def test_count_cap_evicts_the_oldest_finished_first():
    s = store(max_stored=2)
    for name in ("resp_1", "resp_2", "resp_3"):
        put(s, name)
    assert len(s) == 2 and s.num_evicted == 1
    with pytest.raises(ApiError):
        s.get("resp_1", None)
    assert s.get("resp_3", None)


def test_age_cap_counts_from_when_a_response_finished():
    clock = FakeClock()
    s = store(clock, max_age_s=10)
    running = put(s, "resp_run", status="in_progress")
    put(s, "resp_done")
    clock.now_s = 11
    with pytest.raises(ApiError):
        s.get("resp_done", None)  # finished 11 s ago
    assert s.get("resp_run", None) is running  # in flight: never evicted
    s.finish(running, response("resp_run"))
    clock.now_s = 20
    assert s.get("resp_run", None).status == "completed"  # 9 s after it finished
    clock.now_s = 22
    with pytest.raises(ApiError):
        s.get("resp_run", None)


def test_runs_in_flight_are_not_evicted_by_the_count_cap():
    s = store(max_stored=1)
    put(s, "resp_run", status="in_progress")
    put(s, "resp_1")
    put(s, "resp_2")
    assert s.get("resp_run", None) and s.get("resp_2", None)
    assert len(s) == 2


def test_conversation_chains_prior_input_and_output_items_in_order():
    s = store()
    first = s.put(response("resp_1", output=[message("one")]), input_items=USER, prior_items=[], owner=None)
    history = s.conversation("resp_1", None)
    second = s.put(response("resp_2", output=[message("two")]), input_items=USER, prior_items=history, owner=None)
    texts = [item.get("content")[0]["text"] for item in s.conversation("resp_2", None)]
    assert texts == ["hi", "one", "hi", "two"]
    assert second.prior_items == first.conversation()


def test_previous_response_id_unknown_is_404_naming_the_param_and_in_flight_is_400():
    s = store()
    with pytest.raises(ApiError) as err:
        s.conversation("resp_nope", None)
    assert (err.value.status, err.value.param) == (404, "previous_response_id")
    put(s, "resp_run", status="in_progress")
    with pytest.raises(ApiError) as err:
        s.conversation("resp_run", None)
    assert (err.value.status, err.value.code) == (400, "previous_response_in_progress")


def test_input_items_get_ids_by_type_and_keep_their_own():
    assert with_id({"type": "message", "role": "user"})["id"].startswith("msg_")
    assert with_id({"type": "function_call_output", "call_id": "c"})["id"].startswith("fco_")
    assert with_id({"id": "mine", "type": "message"})["id"] == "mine"


def test_list_page_orders_paginates_and_reports_has_more():
    items = [{"id": f"i{n}"} for n in range(5)]
    page = list_page(items, after=None, limit=2, order="asc")
    assert [i["id"] for i in page["data"]] == ["i0", "i1"] and page["has_more"]
    page = list_page(items, after=page["last_id"], limit=10, order="asc")
    assert [i["id"] for i in page["data"]] == ["i2", "i3", "i4"] and not page["has_more"]
    page = list_page(items, after=None, limit=20, order="desc")
    assert (page["object"], page["first_id"], page["last_id"]) == ("list", "i4", "i0")
    with pytest.raises(ApiError):
        list_page(items, after="nope", limit=2, order="asc")


# -- the event log ------------------------------------------------------------------------------------------


def event(n: int, kind: str = "response.output_text.delta") -> dict:
    return {"type": kind, "sequence_number": n}


def test_event_log_refuses_a_gap_or_a_repeat():
    log = EventLog(10)
    log.append(event(0))
    with pytest.raises(ValueError):
        log.append(event(0))
    with pytest.raises(ValueError):
        log.append(event(2))


async def test_follow_replays_after_the_cursor_then_follows_live_events_until_closed():
    log = EventLog(100)
    for n in range(3):
        log.append(event(n))
    seen = []

    async def read() -> None:
        async for e in log.follow(starting_after=0):
            seen.append(e["sequence_number"])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert seen == [1, 2]
        for n in range(3, 6):
            log.append(event(n))
        log.close()
    assert seen == [1, 2, 3, 4, 5]


async def test_readers_that_come_at_every_point_together_see_each_event_once():
    log = EventLog(100)
    results = {}

    async def read(cursor) -> None:
        results[cursor] = [e["sequence_number"] async for e in log.follow(cursor)]

    async with trio.open_nursery() as nursery:
        for n in range(20):
            nursery.start_soon(read, None if n == 0 else n - 1)
            await trio.testing.wait_all_tasks_blocked()
            log.append(event(n))
        log.close()
    for cursor, numbers in results.items():
        start = 0 if cursor is None else cursor + 1
        assert numbers == list(range(start, 20))


async def test_a_cursor_older_than_the_kept_events_is_refused_before_streaming():
    log = EventLog(3)
    for n in range(5):
        log.append(event(n))
    assert log.first_kept == 2
    with pytest.raises(EventsDropped):
        log.check_resumable(0)
    log.check_resumable(1)
    log.close()
    assert [e["sequence_number"] async for e in log.follow(1)] == [2, 3, 4]


# -- background runs, driven by the fault-injection driver -----------------------------------------------------


class ScriptedRun:
    """Fault injection: a stand-in for run_response. Emits created, then `num_items` output items
    (added + done), holding before the end until `release` is set; fails instead of completing when
    `fail` is set. `aborted` records that its finally ran (where run_response aborts the engine request)."""

    def __init__(self, response_id: str, num_items: int = 2, fail: bool = False):
        self.response_id, self.num_items, self.fail = response_id, num_items, fail
        self.release = trio.Event()
        self.aborted = False
        self.n = 0

    async def emit_next(self, emit, kind: str, **fields) -> None:
        await emit({"type": kind, "sequence_number": self.n, **fields})
        self.n += 1

    async def __call__(self, emit) -> dict:
        try:
            await self.emit_next(emit, "response.created", response=response(self.response_id, "in_progress"))
            items = [message(f"m{i}") for i in range(self.num_items)]
            for i, item in enumerate(items):
                await self.emit_next(emit, "response.output_item.added", output_index=i, item=item)
                await self.emit_next(emit, "response.output_item.done", output_index=i, item=item)
            await self.release.wait()
            if self.fail:
                raise RuntimeError("the engine fell over (injected)")
            final = response(self.response_id, output=items)
            await self.emit_next(emit, "response.completed", response=final)
            return final
        finally:
            self.aborted = True


def start(runs: BackgroundRuns, driver: ScriptedRun, owner=None):
    return runs.start(driver, initial=response(driver.response_id, "queued"), input_items=USER, prior_items=[],
                      owner=owner)


async def with_runs(test, **limits) -> None:
    s = store(**limits)
    runs = BackgroundRuns(s, s.config)
    async with trio.open_nursery() as nursery:
        await nursery.start(runs.serve)
        await test(s, runs)
        nursery.cancel_scope.cancel()


async def test_fault_injected_background_run_is_queued_then_completes_into_the_store():
    async def test(s, runs):
        driver = ScriptedRun("resp_bg")
        record = start(runs, driver)
        assert record.response["status"] == "queued"
        await trio.testing.wait_all_tasks_blocked()
        assert s.get("resp_bg", None).status == "in_progress"
        driver.release.set()
        await record.done.wait()
        assert record.status == "completed" and record.log.is_closed and runs.num_running == 0
        numbers = [e["sequence_number"] async for e in record.log.follow()]
        assert numbers == list(range(6))

    await with_runs(test)


async def test_fault_injected_cancel_stores_cancelled_with_the_items_done_and_runs_the_finally():
    async def test(s, runs):
        driver = ScriptedRun("resp_bg", num_items=1)
        start(runs, driver)
        await trio.testing.wait_all_tasks_blocked()
        final = await runs.cancel("resp_bg", None)
        assert final["status"] == "cancelled" and driver.aborted
        assert [item["id"] for item in final["output"]] == ["msg_m0"]
        assert await runs.cancel("resp_bg", None) == final  # idempotent
        assert runs.num_running == 0 and runs.num_cancelled == 1

    await with_runs(test)


async def test_fault_injected_failure_is_stored_as_failed_with_a_response_failed_event():
    async def test(s, runs):
        driver = ScriptedRun("resp_bg", fail=True)
        record = start(runs, driver)
        driver.release.set()
        await record.done.wait()
        assert record.status == "failed" and record.response["error"]["code"] == "server_error"
        events = [e async for e in record.log.follow()]
        assert events[-1]["type"] == "response.failed" and events[-1]["sequence_number"] == len(events) - 1

    await with_runs(test)


async def test_fault_injected_runs_past_the_bound_get_429_and_a_finished_one_frees_a_slot():
    async def test(s, runs):
        drivers = [ScriptedRun(f"resp_{n}") for n in range(2)]
        for driver in drivers:
            start(runs, driver)
        with pytest.raises(ApiError) as err:
            start(runs, ScriptedRun("resp_x"))
        assert (err.value.status, err.value.code) == (429, "too_many_background_responses")
        drivers[0].release.set()
        await s.get("resp_0", None).done.wait()
        start(runs, ScriptedRun("resp_2"))

    await with_runs(test, max_background=2)


async def test_fault_injected_delete_of_a_running_response_cancels_it():
    async def test(s, runs):
        driver = ScriptedRun("resp_bg")
        record = start(runs, driver)
        await trio.testing.wait_all_tasks_blocked()
        runs.delete("resp_bg", None)
        await record.done.wait()
        assert driver.aborted and record.status == "cancelled"
        with pytest.raises(ApiError):
            s.get("resp_bg", None)

    await with_runs(test)


async def test_cancelling_a_response_that_was_not_background_is_400():
    async def test(s, runs):
        put(s, "resp_fg")
        with pytest.raises(ApiError) as err:
            await runs.cancel("resp_fg", None)
        assert err.value.status == 400

    await with_runs(test)


async def test_fault_injected_server_shutdown_cancels_every_run():
    s = store()
    runs = BackgroundRuns(s, s.config)
    drivers = [ScriptedRun(f"resp_{n}") for n in range(3)]
    async with trio.open_nursery() as nursery:
        await nursery.start(runs.serve)
        for driver in drivers:
            start(runs, driver)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert all(d.aborted for d in drivers) and runs.num_running == 0
    assert {s.get(d.response_id, None).status for d in drivers} == {"cancelled"}


async def test_a_reader_the_log_overtook_gets_an_error_event_not_a_broken_stream():
    from rill.openai.responses_api.store import StoredResponse
    from rill.transports.responses_store_http import follow_frames

    log = EventLog(2)
    record = StoredResponse(response("resp_a", "in_progress"), [], [], None, 0.0, background=True, log=log)
    log.append(event(0))
    frames = follow_frames(record)
    assert (await anext(frames)).startswith(b"event: response.output_text.delta\n")
    for n in range(1, 4):
        log.append(event(n))  # events 1 and 2 leave the log before the reader reads them
    assert (await anext(frames)).startswith(b"event: error\n")
    with pytest.raises(StopAsyncIteration):
        await anext(frames)
