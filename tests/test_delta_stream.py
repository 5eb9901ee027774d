"""DeltaStream: the bridge's per-request stream keeps a memory channel's semantics for its reader."""

import pytest
import trio
import trio.testing

from rill.engine.delta_stream import DeltaStream


async def test_items_arrive_in_order_then_the_end():
    stream = DeltaStream()
    for item in range(3):
        assert stream.put(item)
    stream.end()
    assert [item async for item in stream] == [0, 1, 2]
    with pytest.raises(trio.EndOfChannel):
        await stream.receive()


async def test_a_parked_reader_wakes_on_put_and_on_end():
    stream, got = DeltaStream(), []

    async def read():
        async for item in stream:
            got.append(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        stream.put("a")
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["a"]
        stream.put("b")
        stream.put("c")
        stream.end()
    assert got == ["a", "b", "c"]


async def test_receive_nowait_would_block_until_an_item_and_ends_after_the_last():
    stream = DeltaStream()
    with pytest.raises(trio.WouldBlock):
        stream.receive_nowait()
    stream.put(1)
    stream.end()
    stream.end()  # idempotent
    assert stream.receive_nowait() == 1
    with pytest.raises(trio.EndOfChannel):
        stream.receive_nowait()


async def test_put_after_the_reader_closed_is_refused_and_queued_items_are_dropped():
    stream = DeltaStream()
    stream.put(1)
    with stream:
        pass
    assert not stream.put(2)  # the bridge aborts the request on this
    with pytest.raises(trio.ClosedResourceError):
        stream.receive_nowait()
    with pytest.raises(trio.ClosedResourceError):
        await stream.receive()


async def test_put_after_end_is_a_bug_of_the_writer():
    stream = DeltaStream()
    stream.end()
    with pytest.raises(trio.ClosedResourceError):
        stream.put(1)


async def test_a_cancelled_receive_takes_nothing_and_the_stream_goes_on():
    stream = DeltaStream()
    with trio.move_on_after(0.01) as scope:
        await stream.receive()
    assert scope.cancelled_caught
    stream.put("kept")
    assert await stream.receive() == "kept"


async def test_receive_checkpoints_even_with_an_item_waiting():
    stream = DeltaStream()
    stream.put(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await stream.receive()  # cancelled at its checkpoint, before taking the item
    assert scope.cancelled_caught
    assert stream.receive_nowait() == 1


async def test_a_second_concurrent_reader_is_refused():
    stream = DeltaStream()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.receive)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await stream.receive()
        stream.put(None)


async def test_closing_under_a_parked_reader_raises_closed_in_it():
    stream, raised = DeltaStream(), []

    async def read():
        try:
            await stream.receive()
        except trio.ClosedResourceError:
            raised.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        await stream.aclose()
    assert raised == [True]


async def test_async_with_closes_it():
    stream = DeltaStream()
    async with stream as same:
        assert same is stream
    assert not stream.put(1)
    assert isinstance(stream, trio.abc.ReceiveChannel)


async def test_priced_items_count_while_queued_and_not_once_taken_or_dropped():
    stream = DeltaStream(size_of=len)
    stream.put(b"abc")
    stream.put(b"de")
    assert stream.num_bytes == 5
    assert await stream.receive() == b"abc" and stream.num_bytes == 2
    assert stream.receive_nowait() == b"de" and stream.num_bytes == 0
    stream.put(b"fgh")
    stream.close()  # what was queued is dropped with it
    assert stream.num_bytes == 0
