"""Hostile clients for tests: raw sockets on 127.0.0.1 with a small receive buffer, that send a
request (HTTP, or WebSocket events through wsproto) and then never read, or leave abruptly."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import trio
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import TextMessage

SMALL_RCVBUF = 4096  # the kernel doubles it; the window it advertises stays a few KB


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process (Linux /proc)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096


async def open_tight_socket(url: str) -> trio.SocketStream:
    """A TCP connection to url's host and port whose receive buffer is small, so that a server's
    writes stall once a few KB wait unread (set before connecting: the window scale is fixed then)."""
    parts = urlsplit(url)
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)
    await sock.connect((parts.hostname, parts.port))
    return trio.SocketStream(sock)


async def post_and_never_read(url: str, path: str, body: dict, headers: dict[str, str] | None = None
                              ) -> trio.SocketStream:
    """POST a JSON body and read nothing back: the caller holds the connection open, or closes it."""
    stream = await open_tight_socket(url)
    data = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"POST {path} HTTP/1.1\r\nHost: {urlsplit(url).netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{extra}\r\n")
    await stream.send_all(head.encode() + data)
    return stream


class RawRealtimeClient:
    """A WebSocket client on a tight socket: it upgrades, reads up to session.created, then writes
    events and reads nothing unless asked."""

    def __init__(self, stream: trio.SocketStream, ws: Connection):
        self.stream, self.ws = stream, ws

    @classmethod
    async def connect(cls, url: str) -> RawRealtimeClient:
        """url: ws://127.0.0.1:PORT/PATH. The handshake by hand (the server's key check is not the point)."""
        stream = await open_tight_socket(url.replace("ws://", "http://"))
        parts = urlsplit(url)
        await stream.send_all(f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                              "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              "Sec-WebSocket-Version: 13\r\n\r\n".encode())
        data = b""
        with trio.fail_after(20):
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        client = cls(stream, Connection(ConnectionType.CLIENT))
        client.ws.receive_data(rest)
        await client._until(TextMessage)  # session.created
        return client

    async def _until(self, kind) -> None:
        with trio.fail_after(20):
            while True:
                for event in self.ws.events():
                    if isinstance(event, kind):
                        return
                self.ws.receive_data(await self.stream.receive_some(65536))

    async def send(self, type_: str, **fields) -> None:
        await self.stream.send_all(self.ws.send(TextMessage(json.dumps({"type": type_, **fields}))))

    async def ask(self, text: str, max_tokens: int) -> None:
        """A user message and a response to it; none of the answer is read. Greedy: an endless model's
        answer then never ends on its own (sampled, it may draw the end of turn)."""
        await self.send("conversation.item.create",
                        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        await self.send("response.create", response={"max_output_tokens": max_tokens, "temperature": 0})

    async def half_close(self) -> None:
        """Send FIN (no close frame) and keep the socket, unread: the client has left, its kernel stays."""
        await self.stream.send_eof()

    async def leave_abruptly(self) -> None:
        """Close the socket with the answer unread: the kernel resets the connection, no close frame."""
        self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        await self.stream.aclose()
