"""The floor of delivering one value to each of N parked trio tasks (what rill's bridge does once per delivery
at N running requests), over trio memory channels and over rill's DeltaStream, side by side in one process:
rounds alternate the two, so that the machine's drift falls on both alike.

Per round and side: the time of the N puts (send_nowait / DeltaStream.put, each waking its reader: the
bridge's own work, what `rill bench scheduler` counts as delivery), and the trio thread's CPU time until every
reader has taken its value and parked again (the puts plus the readers' wake-ups). p50 over the rounds.

    python benchmarks/trio-send-floor.py [N] [ROUNDS]
"""

import statistics
import sys
import time

import trio
import trio.testing

from rill.engine.delta_stream import DeltaStream


def memory_channel():
    send, recv = trio.open_memory_channel(float("inf"))
    return send.send_nowait, recv


def delta_stream():
    stream = DeltaStream()
    return stream.put, stream


async def one_round(make, n: int, value) -> tuple[float, float]:
    pairs = [make() for _ in range(n)]

    async def consume(recv) -> None:
        async for _ in recv:
            pass

    async with trio.open_nursery() as nursery:
        for _, recv in pairs:
            nursery.start_soon(consume, recv)
        await trio.testing.wait_all_tasks_blocked()
        puts, wholes = [], []
        for _ in range(5):
            c0, t0 = time.thread_time(), time.perf_counter()
            for put, _ in pairs:
                put(value)
            puts.append(time.perf_counter() - t0)
            await trio.testing.wait_all_tasks_blocked()  # every reader took its value and parked again
            wholes.append(time.thread_time() - c0)
        nursery.cancel_scope.cancel()
    return statistics.median(puts), statistics.median(wholes)


async def main(n: int, rounds: int) -> None:
    sides = {"memory channel": memory_channel, "DeltaStream": delta_stream}
    results = {name: ([], []) for name in sides}
    for _ in range(rounds):
        for name, make in sides.items():
            put, whole = await one_round(make, n, object())
            results[name][0].append(put)
            results[name][1].append(whole)
    p50 = {name: (statistics.median(a) * 1e3, statistics.median(b) * 1e3) for name, (a, b) in results.items()}
    for name, (put, whole) in p50.items():
        print(f"{name:>14}: {n} puts {put:.3f} ms ({put / n * 1e3:.2f} us each); puts + readers {whole:.3f} ms")
    (cp, cw), (dp, dw) = p50["memory channel"], p50["DeltaStream"]
    print(f"DeltaStream / memory channel: puts {dp / cp:.2f}x, puts + readers {dw / cw:.2f}x "
          f"({rounds} alternating rounds, trio {trio.__version__})")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 1024, int(sys.argv[2]) if len(sys.argv) > 2 else 10)
