"""`--stream-interval N` over HTTP: the same answer in fewer SSE events (the first token at once,
then groups of at least N, then the end), for chat and completions, through the openai SDK."""

from __future__ import annotations

import openai
import pytest

from helpers_models import make_model_dir
from helpers_server import assert_nothing_left, one_torch_thread, running_server  # noqa: F401

HI = [{"role": "user", "content": "hi"}]
TOKENS = 25


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


async def chat_pieces(server, model_dir) -> list[str]:
    client = openai.AsyncOpenAI(base_url=server.v1, api_key="x")
    stream = await client.chat.completions.create(model=str(model_dir), messages=HI, temperature=0,
                                                  max_tokens=TOKENS, stream=True, extra_body={"ignore_eos": True},
                                                  stream_options={"include_usage": True})
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        pieces += [c.delta.content for c in chunk.choices if c.delta.content]
    assert usage.completion_tokens == TOKENS
    return pieces


async def completion_pieces(server, model_dir) -> list[str]:
    client = openai.AsyncOpenAI(base_url=server.v1, api_key="x")
    stream = await client.completions.create(model=str(model_dir), prompt="hello there", temperature=0,
                                             max_tokens=TOKENS, stream=True, extra_body={"ignore_eos": True})
    return [c.text async for chunk in stream for c in chunk.choices if c.text]


@pytest.mark.parametrize("interval", [4, 8])
async def test_the_same_answer_in_fewer_events(model_dir, interval):
    async with running_server(model_dir) as server:
        every = await chat_pieces(server, model_dir), await completion_pieces(server, model_dir)
    async with running_server(model_dir, stream_interval=interval) as server:
        grouped = await chat_pieces(server, model_dir), await completion_pieces(server, model_dir)
        await assert_nothing_left(server)
    for one_by_one, held in zip(every, grouped):
        assert "".join(held) == "".join(one_by_one)
        # the first token at once, then groups of >= N tokens (a group's text may be empty until a
        # character completes, so count events, not characters)
        assert len(held) <= 1 + -(-(TOKENS - 1) // interval)  # against up to TOKENS one by one


@pytest.mark.parametrize("argv,message", [
    (["serve", "--stream-interval", "0"], "stream_interval must be >= 1, got 0"),
    (["serve", "--cuda-graphs"], "cuda_graphs needs a CUDA device"),
    (["generate", "--max-num-seqs", "0", "hi"], "max_num_seqs must be >= 1, got 0"),
])
def test_an_engine_option_out_of_range_is_one_line_and_exit_2(argv, message, capsys):
    from rill.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rill: error: ") and message in err and "Traceback" not in err
