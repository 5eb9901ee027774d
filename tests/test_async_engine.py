"""The trio bridge: the real EngineCore on its worker thread, driven from trio tasks.

Outputs must equal the core driven directly; leaving a stream early must free the request's KV;
each engine step must reach trio in one delivery; a worker crash (injected) must fail every
live request with an error and mark the engine dead instead of leaving callers hanging.
"""

import random

import pytest
import trio

from helpers_models import make_model_dir
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.engine.core import EngineCore
from rill.errors import EngineDeadError
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
        await wait_for(lambda: engine.num_deliveries == engine.core.stats.num_steps)
        # Four requests of 10 tokens batched together: far fewer deliveries than deltas.
        assert engine.num_deliveries < 4 * 10


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
