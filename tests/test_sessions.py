"""The session rules without sockets or an engine: ordering and repeats, limits at and past each
bound, the lifecycle table, NDJSON framing, the output log, and the manager's caps, visibility
and reaper (on trio's autojump clock, so expiry costs no real time)."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from rill.sessions import (
    ChunkConflict, CloseReason, InputChunk, Modality, PayloadTooLarge, SessionGone, SessionManager, SessionNotFound,
    SessionState, StartPolicy, StreamingInputConfig, TooManySessions, UnsupportedModality, parse_start_policy,
)
from rill.sessions.config import SessionOptions, StartKind
from rill.sessions.errors import SessionError
from rill.sessions.ndjson import NdjsonFramer
from rill.sessions.ordering import ReorderWindow
from rill.sessions.output import OutputLog, with_id
from rill.sessions.session import StreamingSession
from rill.sessions.state import TRANSITIONS, InvalidTransition, SessionEvent, next_state


def chunk(sid: int, payload="x", **kw) -> InputChunk:
    return InputChunk(sequence_id=sid, payload=payload, **kw)


# -- ordering ---------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_arrival_order_with_repeats_applies_each_chunk_once_in_order(data):
    n = data.draw(st.integers(1, 12))
    arrivals = data.draw(st.permutations(range(n)))
    repeats = data.draw(st.lists(st.sampled_from(range(n)), max_size=6))
    window = ReorderWindow(max_pending=n)
    applied = []
    for sid in [*arrivals, *repeats]:
        c = chunk(sid, f"p{sid}")
        if not window.is_duplicate(c):
            applied += window.offer(c)
    assert [c.sequence_id for c in applied] == list(range(n))
    assert window.num_duplicates == len(repeats) and window.num_pending == 0 and not window.missing()


def test_a_repeat_with_another_payload_is_a_conflict_whether_applied_or_waiting():
    window = ReorderWindow(max_pending=4)
    window.offer(chunk(0, "a"))
    window.offer(chunk(2, "c"))
    for sid in (0, 2):
        with pytest.raises(ChunkConflict, match=f"sequence_id {sid}") as info:
            window.is_duplicate(chunk(sid, "different"))
        assert info.value.status == 409
    assert window.is_duplicate(chunk(2, "c"))


def test_an_early_chunk_waits_up_to_max_pending_ahead_and_past_it_is_409():
    window = ReorderWindow(max_pending=3)
    assert window.offer(chunk(3)) == []  # at the limit: 3 ahead of the next expected (0)
    with pytest.raises(ChunkConflict, match="too far ahead") as info:
        window.check_can_offer(chunk(4))  # past it
    assert info.value.code == "too_far_ahead"
    assert [c.sequence_id for c in window.offer(chunk(0))] == [0]
    assert window.missing() == [1, 2]


def test_input_ends_at_the_end_of_input_chunk():
    window = ReorderWindow(max_pending=8)
    window.offer(chunk(2, end_of_input=True))
    assert window.missing() == [0, 1] and not window.is_complete
    with pytest.raises(ChunkConflict, match="after the end of input"):
        window.offer(chunk(3))
    with pytest.raises(ChunkConflict, match="already ends"):
        window.offer(chunk(1, end_of_input=True))
    window.offer(chunk(0))
    assert [c.sequence_id for c in window.offer(chunk(1))] == [1, 2]
    assert window.is_complete
    assert ReorderWindow(4).missing(last_sequence_id=2) == [0, 1, 2]


# -- lifecycle --------------------------------------------------------------------------------------


def test_the_lifecycle_table_allows_exactly_its_transitions():
    for state in SessionState:
        for event in SessionEvent:
            if (state, event) in TRANSITIONS:
                assert next_state(state, event) is TRANSITIONS[state, event]
            else:
                with pytest.raises(InvalidTransition):
                    next_state(state, event)
    assert next_state(SessionState.OPEN, SessionEvent.FINISH) is SessionState.FINISHED  # on_end_only


# -- limits on one session --------------------------------------------------------------------------


def make_session(**limits) -> StreamingSession:
    return StreamingSession("s", None, StreamingInputConfig(**limits), now_s=0.0)


def test_max_chunk_bytes_takes_a_chunk_at_the_limit_and_refuses_one_past_it_leaving_the_session_open():
    session = make_session(max_chunk_bytes=4)
    session.accept(chunk(0, "éé"))  # 4 UTF-8 bytes
    with pytest.raises(PayloadTooLarge) as info:
        session.accept(chunk(1, "abcde"))
    assert info.value.code == "chunk_too_large" and session.state is SessionState.OPEN
    session.accept(chunk(1, [7], modality=Modality.TOKENS))  # 4 bytes per token id


def test_max_payload_per_session_counts_every_new_chunk_and_not_repeats():
    session = make_session(max_payload_bytes_per_session=6, max_chunk_bytes=100)
    session.accept(chunk(0, "abc"))
    session.accept(chunk(0, "abc"))  # a repeat costs nothing
    session.accept(chunk(2, "def"))  # waiting early chunks count: 6 bytes, at the limit
    with pytest.raises(PayloadTooLarge) as info:
        session.accept(chunk(1, "g"))
    assert info.value.code == "session_payload_too_large" and info.value.status == 413
    assert session.num_payload_bytes == 6 and session.num_chunks_received == 2


def test_sample_rate_is_for_audio_and_payloads_must_match_their_modality():
    """Audio itself is the run's to refuse when no speech model is served (tests/test_streaming_audio.py)."""
    session = make_session()
    with pytest.raises(UnsupportedModality, match="sample_rate") as info:
        session.accept(InputChunk(sequence_id=0, payload="AAAA", sample_rate=16000))
    assert info.value.status == 400
    with pytest.raises(UnsupportedModality, match="list of token ids"):
        session.accept(InputChunk(sequence_id=0, modality=Modality.TOKENS, payload="12"))
    with pytest.raises(UnsupportedModality, match="a string"):
        session.accept(InputChunk(sequence_id=0, payload=[1, 2]))


def test_input_after_finish_is_409_and_after_delete_410():
    session = make_session()
    session.fire(SessionEvent.FINISH)
    with pytest.raises(ChunkConflict, match="ended"):
        session.accept(chunk(0))
    session.fire(SessionEvent.CLOSE)
    session.close_reason = CloseReason.DELETED
    with pytest.raises(SessionGone) as info:
        session.accept(chunk(0))
    assert info.value.code == "session_deleted"


def test_finishing_with_missing_chunks_names_them():
    session = make_session()
    session.accept(chunk(0))
    session.accept(chunk(3))
    with pytest.raises(ChunkConflict, match=r"\[1, 2\]") as info:
        session.check_can_finish()
    assert info.value.code == "missing_chunks"
    with pytest.raises(ChunkConflict, match=r"\[1, 2, 4, 5\]"):
        session.check_can_finish(last_sequence_id=5)


# -- settings -------------------------------------------------------------------------------------------


def test_start_policies_parse_and_set_the_engine_threshold_after_the_prompt_prefix():
    assert parse_start_policy("on_first_chunk").start_after_tokens(10) == 11
    assert parse_start_policy("on_min_length:32").start_after_tokens(10) == 42
    assert parse_start_policy("on_end_only").start_after_tokens(10) is None
    assert str(parse_start_policy("on_min_length:5")) == "on_min_length:5"
    for bad in ("on_min_length", "on_min_length:0", "on_min_length:x", "soon", "on_end_only:3"):
        with pytest.raises(SessionError, match="start_policy"):
            parse_start_policy(bad)


def test_a_session_choice_overrides_the_server_default():
    config = StreamingInputConfig(start_policy=StartPolicy(StartKind.ON_END_ONLY))
    policy, mode = SessionOptions(start_policy="on_min_length:3").resolve(config)
    assert policy == StartPolicy(StartKind.ON_MIN_LENGTH, 3) and mode is config.output_mode
    assert SessionOptions().resolve(config)[0] == config.start_policy


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RILL_SESSION_TIMEOUT_SEC", "7.5")
    monkeypatch.setenv("RILL_MAX_OPEN_SESSIONS_PER_KEY", "3")
    monkeypatch.setenv("RILL_START_POLICY", "on_min_length:8")
    monkeypatch.setenv("RILL_OUTPUT_MODE", "respond_per_chunk")
    monkeypatch.setenv("RILL_STREAMING_INPUT", "off")
    config = StreamingInputConfig.from_env()
    assert config.session_timeout_s == 7.5 and config.max_open_sessions_per_key == 3
    assert str(config.start_policy) == "on_min_length:8" and config.output_mode.value == "respond_per_chunk"
    assert not config.enabled


# -- NDJSON framing -------------------------------------------------------------------------------------


def test_ndjson_lines_split_across_reads_keep_their_editor_line_numbers():
    framer = NdjsonFramer(max_line_bytes=100)
    assert framer.feed(b'{"a": 1}\r\n\n{"b"') == [(1, b'{"a": 1}')]
    assert framer.feed(b': 2}\n  \n{"c": 3}') == [(3, b'{"b": 2}')]
    assert framer.close() == [(5, b'{"c": 3}')]


def test_an_ndjson_line_longer_than_the_limit_is_413_naming_it():
    framer = NdjsonFramer(max_line_bytes=8)
    framer.feed(b"12345678\n")  # at the limit
    with pytest.raises(PayloadTooLarge, match="line 2"):
        framer.feed(b"123456789")  # past it, before its newline arrives


# -- the output log ----------------------------------------------------------------------------------------


async def test_output_readers_follow_live_and_resume_from_any_index():
    log = OutputLog()
    seen = []

    async def reader(start):
        async for i, frame in log.follow(start):
            seen.append((start, i, frame))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, 0)
        log.append(b"a")
        await trio.testing.wait_all_tasks_blocked()
        log.append(b"b")
        nursery.start_soon(reader, 1)  # a reconnect after frame 0
        await trio.testing.wait_all_tasks_blocked()
        log.close()
    assert sorted(seen) == [(0, 0, b"a"), (0, 1, b"b"), (1, 1, b"b")]
    assert with_id(7, b"data: x\n\n") == b"id: 7\ndata: x\n\n"


# -- the manager ----------------------------------------------------------------------------------------


def test_max_open_sessions_allows_the_limit_and_refuses_one_more_with_429():
    manager = SessionManager(StreamingInputConfig(max_open_sessions=2), clock=lambda: 0.0)
    first = manager.open("k1")
    manager.open("k2")
    with pytest.raises(TooManySessions) as info:
        manager.open("k3")
    assert info.value.status == 429
    manager.close(first, CloseReason.DELETED)
    manager.open("k3")  # a closed session frees its place


def test_max_open_sessions_per_key_counts_each_key_alone():
    manager = SessionManager(StreamingInputConfig(max_open_sessions_per_key=1), clock=lambda: 0.0)
    manager.open("k1")
    manager.open("k2")
    with pytest.raises(TooManySessions, match="this API key"):
        manager.open("k1")


def test_a_session_is_visible_only_to_its_owner_and_gone_after_delete():
    manager = SessionManager(StreamingInputConfig(), clock=lambda: 0.0)
    session = manager.open("k1")
    assert manager.get(session.session_id, "k1") is session
    with pytest.raises(SessionNotFound):
        manager.get(session.session_id, "k2")
    manager.close(session, CloseReason.DELETED)
    with pytest.raises(SessionGone):
        manager.get(session.session_id, "k1")
    with pytest.raises(SessionNotFound):  # another key learns nothing, not even that it existed
        manager.get(session.session_id, "k2")
    assert not manager.sessions and manager.num_open == 0


def test_closing_calls_the_engine_hook_once_and_completed_sessions_stay_readable():
    manager = SessionManager(StreamingInputConfig(), clock=lambda: 0.0)
    closed = []
    manager.on_close = closed.append
    session = manager.open(None)
    manager.close(session, CloseReason.COMPLETED)
    manager.close(session, CloseReason.COMPLETED)
    assert closed == [session] and manager.get(session.session_id, None) is session
    assert manager.num_open == 0


def test_finished_sessions_kept_for_reading_are_bounded_least_recently_used_first():
    now = [0.0]
    manager = SessionManager(StreamingInputConfig(max_open_sessions=2), clock=lambda: now[0])
    done = []
    for _ in range(3):
        now[0] += 1.0
        done.append(manager.open("k"))
        manager.close(done[-1], CloseReason.COMPLETED)
        if len(done) == 2:
            now[0] += 1.0
            manager.get(done[0].session_id, "k")  # read: now the most recently used
    assert set(manager.sessions) == {done[0].session_id, done[2].session_id}
    with pytest.raises(SessionGone, match="expired"):
        manager.get(done[1].session_id, "k")


async def test_the_reaper_closes_idle_sessions_and_then_forgets_completed_ones(autojump_clock):
    config = StreamingInputConfig(session_timeout_s=10.0)
    manager = SessionManager(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        idle, busy, done = manager.open("k"), manager.open("k"), manager.open("k")
        manager.finish(busy)  # generating: not idle whatever the clock says
        manager.close(done, CloseReason.COMPLETED)
        await trio.sleep(9.0)
        manager.get(done.session_id, "k")  # reading a result is activity
        await trio.sleep(2.0)
        assert idle.close_reason is CloseReason.EXPIRED and manager.num_expired == 1
        assert busy.state is SessionState.FINISHED
        assert done.session_id in manager.sessions
        await trio.sleep(10.0)
        assert done.session_id not in manager.sessions
        with pytest.raises(SessionGone, match="expired"):
            manager.get(done.session_id, "k")
        await manager.stop()
    assert busy.close_reason is CloseReason.SHUTDOWN and not manager.sessions
