"""The floor of delivering one value to each of N parked trio tasks over their own memory channels
(what rill's bridge does once per delivery at N running requests): time of N send_nowait calls,
each waking its receiver, p50 over 50 rounds. `python bench-results/trio-send-floor.py [N]`."""

import sys
import time

import trio


async def main(n: int) -> None:
    channels = [trio.open_memory_channel(float("inf")) for _ in range(n)]

    async def consume(recv) -> None:
        async for _ in recv:
            pass

    async with trio.open_nursery() as nursery:
        for _, recv in channels:
            nursery.start_soon(consume, recv)
        await trio.sleep(0.1)  # every consumer parked in receive()
        times = []
        for k in range(50):
            t0 = time.perf_counter()
            for send, _ in channels:
                send.send_nowait(k)
            times.append(time.perf_counter() - t0)
            await trio.sleep(0.002)  # the consumers run and park again
        for send, _ in channels:
            send.close()
    times.sort()
    print(f"{n} send_nowait to parked receivers: p50 {times[25] * 1e3:.3f} ms ({times[25] / n * 1e6:.2f} us each), "
          f"min {times[0] * 1e3:.3f} ms; trio {trio.__version__}")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 1024)
