"""The trio bridge: the real EngineCore on its worker thread, driven from trio tasks.

Outputs must equal the core driven directly; leaving a stream early must free the request's KV;
each engine step must reach trio in one delivery; a worker crash (injected) must fail every
live request with an error and mark the engine dead instead of leaving callers hanging.
"""

import random
import time

import pytest
import trio

from helpers_models import make_model_dir
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.engine.core import EngineCore
from rill.errors import EngineDeadError
from rill.outputs import RequestDelta, TokenLogprob, coalesce
from rill.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


def config(model_dir, **kw) -> EngineConfig:
    return EngineConfig(model=str(model_dir), **{"num_kv_blocks": 128, **kw})


def prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 400) for _ in range(rng.randrange(4, 60))] for _ in range(n)]


def offline(model_dir, ids, params=GREEDY) -> list[int]:
    core = EngineCore(config(model_dir))
    core.add_request("x", ids, params)
    out = []
    for _ in range(500):
        for d in core.step():
            out += d.token_ids
            if d.finished:
                return out
    raise AssertionError("did not finish")


async def collect(engine, ids, params=GREEDY):
    tokens, last = [], None
    async for delta in engine.generate(ids, params):
        tokens += delta.token_ids
        last = delta
    return tokens, last


async def wait_for(predicate, seconds=10.0):
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.01)


async def test_concurrent_requests_match_the_core_driven_directly(model_dir):
    ps = prompts(6)
    results = {}
    async with open_engine(config(model_dir)) as engine:
        async with trio.open_nursery() as nursery:
            for i, p in enumerate(ps):
                async def one(i=i, p=p):
                    results[i] = await collect(engine, p)
                nursery.start_soon(one)
        bm = engine.core.block_manager
        await wait_for(lambda: bm.num_free_blocks == bm.num_blocks)
    for i in (0, 3, 5):
        tokens, last = results[i]
        assert tokens == offline(model_dir, ps[i])
        assert last.finish_reason == "length" and last.num_output_tokens == 10


async def test_leaving_the_stream_early_aborts_and_frees_kv(model_dir):
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    async with open_engine(config(model_dir)) as engine:
        bm = engine.core.block_manager
        seen = 0
        async for delta in engine.generate(prompts(1)[0], long):
            seen += len(delta.token_ids)
            if seen >= 3:
                break  # closing the generator aborts the request
        await wait_for(lambda: bm.num_free_blocks == bm.num_blocks and not engine.core.requests)
        assert engine._streams == {}


async def test_cancelled_scope_aborts_and_frees_kv(model_dir):
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    async with open_engine(config(model_dir)) as engine:
        bm = engine.core.block_manager
        with trio.move_on_after(0.2):
            await collect(engine, prompts(1)[0], long)
        await wait_for(lambda: bm.num_free_blocks == bm.num_blocks and not engine.core.requests)


async def test_each_step_reaches_trio_in_one_delivery(model_dir):
    async with open_engine(config(model_dir)) as engine:
        async with trio.open_nursery() as nursery:
            for p in prompts(4, seed=1):
                nursery.start_soon(collect, engine, p)
        await wait_for(lambda: engine.num_delivered_steps == engine.core.stats.num_steps)
        # Four requests of 10 tokens batched together: at most one delivery a step, far fewer
        # than deltas (steps that pile up while trio is busy arrive together).
        assert 0 < engine.num_deliveries <= engine.num_delivered_steps
        assert engine.num_deliveries < 4 * 10


async def test_steps_that_pile_up_while_trio_is_busy_arrive_together_and_in_order(model_dir):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    ids = prompts(1, seed=2)[0]
    async with open_engine(config(model_dir, max_steps_ahead=0)) as engine:  # no brake: it may run on
        async with engine.submit("warm-up", ids, SamplingParams(temperature=0, max_tokens=1)) as warm_up:
            async for _ in warm_up:  # the worker thread is running and idle again
                pass
        deliveries, delivered_steps, steps = engine.num_deliveries, engine.num_delivered_steps, engine.core.stats.num_steps
        recv = engine.submit("busy", ids, params)
        # Hold the trio thread from the submit on (a blocking sleep, no checkpoint) while the worker
        # runs steps: no delivery can run before the hold ends, however fast the worker is.
        deadline = time.monotonic() + 30
        while engine.core.stats.num_steps < steps + 10 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert engine.core.stats.num_steps >= steps + 10
        tokens, num_deltas = [], 0
        async with recv:
            async for delta in recv:
                tokens += delta.token_ids
                num_deltas += 1
        # the held-up steps came in one call
        assert engine.num_deliveries - deliveries < engine.num_delivered_steps - delivered_steps
        assert num_deltas < len(tokens)  # and the stream's tokens in them were merged
    assert tokens == offline(model_dir, ids, params)


@pytest.mark.parametrize("ahead", [1, 3])
async def test_the_worker_runs_at_most_max_steps_ahead_of_a_busy_trio_thread(model_dir, ahead):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    ids = prompts(1, seed=2)[0]
    async with open_engine(config(model_dir, max_steps_ahead=ahead)) as engine:
        async with engine.submit("warm-up", ids, SamplingParams(temperature=0, max_tokens=1)) as warm_up:
            async for _ in warm_up:
                pass
        steps = engine.core.stats.num_steps
        recv = engine.submit("busy", ids, params)
        # Hold the trio thread (a blocking sleep, no checkpoint): the worker posts `ahead` steps, then
        # waits for a delivery that cannot run until the hold ends.
        deadline = time.monotonic() + 30
        while engine.core.stats.num_steps < steps + ahead and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.3)  # ample time for a worker that would not wait to run on
        assert engine.core.stats.num_steps == steps + ahead
        tokens = []
        async with recv:
            async for delta in recv:
                tokens += delta.token_ids
    assert tokens == offline(model_dir, ids, params)


async def test_the_outbox_brake_gives_up_after_its_timeout_and_lets_go_on_a_drain():
    import threading

    from rill.engine.outbox import Outbox

    delivered = []
    outbox = Outbox(trio.lowlevel.current_trio_token(), delivered.extend)
    waits = {}

    def worker():
        outbox.post("a")
        outbox.post("b")
        t0 = time.monotonic()
        waits["held"] = (outbox.wait_below(2, 0.2), time.monotonic() - t0)  # trio is held: times out
        waits["drained"] = outbox.wait_below(2, 10.0)  # returns once trio drains

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(0.5)  # hold the trio thread: no drain can run
    assert waits["held"][0] is False and waits["held"][1] >= 0.2
    with trio.fail_after(10):
        while thread.is_alive():
            await trio.sleep(0.01)
    assert waits["drained"] is True and delivered == ["a", "b"]


def test_max_steps_ahead_below_zero_is_refused_and_its_default_depends_on_the_device(model_dir):
    with pytest.raises(ValueError, match="max_steps_ahead"):
        config(model_dir, max_steps_ahead=-1)
    assert config(model_dir).max_steps_ahead == 4
    assert EngineConfig(model=str(model_dir), device="cuda").max_steps_ahead == 0
    assert config(model_dir, max_steps_ahead=0).max_steps_ahead == 0


def test_coalesce_merges_each_sequence_in_order_up_to_its_end_or_turn_end():
    def d(rid, ids, text, index=0, **kw):
        return RequestDelta(rid, index, ids, text, **kw)

    lp = [TokenLogprob(1, -0.5, 1, None)]
    merged = coalesce([
        d("a", [1], "x", logprobs=lp, num_output_tokens=1), d("b", [7], "q"), d("a", [2], "y", logprobs=lp),
        d("s", [4], "m"), d("a", [3], "z", finish_reason="stop", num_output_tokens=3), d("s", [5], "n", turn_finish_reason="stop"),
        d("s", [6], "o"), d("a", [1], "x", index=1), d("b", [8], "r"), d("b", [], "", finish_reason="length"),
    ])
    assert [(m.request_id, m.index, m.token_ids, m.text) for m in merged] == [
        ("a", 0, [1, 2, 3], "xyz"), ("b", 0, [7, 8], "qr"), ("s", 0, [4, 5], "mn"), ("s", 0, [6], "o"), ("a", 1, [1], "x"),
    ]
    assert merged[0].finish_reason == "stop" and merged[0].num_output_tokens == 3 and merged[0].logprobs == lp * 2
    assert merged[1].finish_reason == "length" and merged[1].logprobs is None
    assert merged[2].turn_finish_reason == "stop" and merged[3].turn_finish_reason is None
    assert coalesce([d("e", [], "", finish_reason="error", error="boom"), d("e", [2], "late")])[0].token_ids == []


async def test_a_request_that_cannot_fit_fails_alone(model_dir):
    async with open_engine(config(model_dir, max_model_len=64)) as engine:
        too_long = list(range(3, 100))
        tokens, last = await collect(engine, too_long)
        assert tokens == [] and last.finish_reason == "error" and "context" in last.error
        tokens, last = await collect(engine, prompts(1)[0][:20])
        assert len(tokens) == 10 and engine.is_alive


async def test_streaming_input_session_equals_the_whole_prompt(model_dir):
    ids = prompts(1, seed=2)[0] + prompts(1, seed=3)[0]
    async with open_engine(config(model_dir)) as engine:
        recv = engine.open_session("s1", GREEDY)
        for start in range(0, len(ids), 7):
            engine.append("s1", ids[start:start + 7])
            await trio.sleep(0)
        engine.finish("s1")
        tokens = []
        async with recv:
            async for delta in recv:
                tokens += delta.token_ids
        bm = engine.core.block_manager
        await wait_for(lambda: bm.num_free_blocks == bm.num_blocks)
    assert tokens == offline(model_dir, ids)


class ExplodingRunner:
    """Fault injection: a model runner that raises on its next step, as a CUDA error would."""

    def execute(self, batch, sampling):
        raise RuntimeError("injected device failure")


async def test_worker_crash_fails_every_live_request_and_marks_the_engine_dead(model_dir):
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    async with open_engine(config(model_dir)) as engine:
        streams = [engine.submit(f"r{i}", p, long) for i, p in enumerate(prompts(3))]
        real = engine.core.runner
        engine.core.runner = ExplodingRunner()
        try:
            with trio.fail_after(10):
                for recv in streams:
                    deltas = [d async for d in recv]
                    assert deltas[-1].finish_reason == "error"
                    assert "injected device failure" in deltas[-1].error
        finally:
            engine.core.runner = real
        assert not engine.is_alive
        with pytest.raises(EngineDeadError):
            engine.submit("late", [5, 6, 7], GREEDY)


# -- --stream-interval ------------------------------------------------------------------------------


async def deltas_of(engine, ids, params):
    return [delta async for delta in engine.generate(ids, params)]


@pytest.mark.parametrize("interval", [1, 4, 30, 31])
async def test_stream_interval_sends_the_first_token_then_groups_of_n_then_the_end(model_dir, interval):
    """The limit: N=30 sends every token after the first in one group with the end; N past the
    answer (31) is the same; N=1 is every step. The tokens are the core's, whatever N."""
    params = SamplingParams(temperature=0, max_tokens=31, ignore_eos=True)
    ids = prompts(1, seed=4)[0]
    async with open_engine(config(model_dir, stream_interval=interval)) as engine:
        got = await deltas_of(engine, ids, params)
        await wait_for(lambda: not engine._held and not engine._streaming)
    tokens = [t for d in got for t in d.token_ids]
    assert tokens == offline(model_dir, ids, params)
    sizes = [len(d.token_ids) for d in got]
    assert got[-1].finish_reason == "length"
    # Steps that reach trio together (it was busy) arrive merged, so sizes can only grow; still, the
    # first token is never held for a group: with N = 30 or 31 it comes well before the rest.
    assert sizes[0] < 30
    first_text = next(i for i, d in enumerate(got) if d.text)
    assert all(size >= interval for size in sizes[first_text + 1 : -1])  # then groups of N until the end
    if interval > 1:
        assert len(got) <= first_text + 1 + -(-(31 - sum(sizes[: first_text + 1])) // interval)


async def test_stream_interval_keeps_n_samples_apart_and_forgets_an_aborted_request(model_dir):
    params = SamplingParams(temperature=0.8, n=3, max_tokens=12, ignore_eos=True, seed=5)
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    async with open_engine(config(model_dir, stream_interval=5)) as engine:
        per_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
        for delta in await deltas_of(engine, prompts(1, seed=6)[0], params):
            per_index[delta.index] += delta.token_ids
        assert all(len(tokens) == 12 for tokens in per_index.values())
        seen = 0
        async for delta in engine.generate(prompts(1, seed=7)[0], long):
            seen += len(delta.token_ids)
            if seen >= 6:
                break  # leaving aborts: nothing of it may stay held
        bm = engine.core.block_manager
        await wait_for(lambda: bm.num_free_blocks == bm.num_blocks and not engine.core.requests)
        assert not engine._held and not engine._streaming


def test_stream_interval_below_one_is_refused(model_dir):
    with pytest.raises(ValueError, match="stream_interval"):
        config(model_dir, stream_interval=0)
