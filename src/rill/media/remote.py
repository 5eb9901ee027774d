"""Remote media: one GET over http(s) to a host the operator allowed, under a deadline and a byte cap.

Blocking (http.client): call it off the trio thread. Each redirect's target is checked against the
policy again, so an allowed host cannot hand the fetch to one that is not. The deadline covers the
whole fetch, redirects included: a timer shuts the socket down when it passes, so a server that drips
headers or body a byte at a time cannot hold the fetch past it. Proxies (HTTP_PROXY) are not used.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from urllib.parse import urljoin, urlsplit

from rill.media.errors import MediaSourceError
from rill.media.policy import MediaPolicy

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_READ_BYTES = 64 << 10


class _Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.001, self.at - time.monotonic())

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.at


def fetch(url: str, policy: MediaPolicy, *, kind: str, param: str | None = None) -> bytes:
    """The body of a 200 answer to GET `url`, following at most `policy.max_redirects` redirects."""
    deadline = _Deadline(policy.fetch_timeout_s)
    for _ in range(policy.max_redirects + 1):
        check_url(url, policy, kind=kind, param=param)
        status, location, body = _get(url, policy, deadline, kind, param)
        if status not in _REDIRECTS:
            return body
        if not location:
            raise MediaSourceError(f"fetching the {kind} got a {status} redirect without a Location", kind=kind,
                                   param=param)
        url = urljoin(url, location)
    raise MediaSourceError(f"fetching the {kind} took more than {policy.max_redirects} redirects", kind=kind,
                           param=param)


def check_url(url: str, policy: MediaPolicy, *, kind: str, param: str | None = None) -> None:
    """An http(s) URL whose host the policy allows, or a MediaSourceError saying why not."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise MediaSourceError(f"a remote {kind} URL must be http(s), got {parts.scheme!r}", kind=kind, param=param)
    if not policy.allows_remote:
        raise MediaSourceError(f"remote {kind} URLs are off on this server (--allowed-media-domains); send the "
                               f"{kind} as a data: URL", kind=kind, param=param)
    if not policy.allows_host(parts.hostname):
        raise MediaSourceError(f"the {kind} URL's host {parts.hostname!r} is not in the allowed media domains",
                               kind=kind, param=param)


def _get(url: str, policy: MediaPolicy, deadline: _Deadline, kind: str, param: str | None):
    """(status, Location header, body): the body only for a 200, capped at policy.max_media_bytes."""
    parts = urlsplit(url)
    conn = _connection(parts, deadline)
    timer = threading.Timer(deadline.remaining(), _shut, args=(conn,))
    timer.start()
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", target, headers={"User-Agent": "rill", "Accept": f"{kind}/*, */*;q=0.5"})
        response = conn.getresponse()
        if response.status in _REDIRECTS:
            return response.status, response.getheader("Location"), b""
        if response.status != 200:
            raise MediaSourceError(f"fetching the {kind} URL got HTTP {response.status} {response.reason}",
                                   kind=kind, param=param)
        return 200, None, _read_body(response, policy, deadline, kind, param)
    except MediaSourceError:
        raise
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        if deadline.passed or isinstance(exc, TimeoutError):
            raise MediaSourceError(f"fetching the {kind} URL took longer than {deadline.seconds:g} s", kind=kind,
                                   param=param) from None
        raise MediaSourceError(f"could not fetch the {kind} URL: {exc}", kind=kind, param=param) from None
    finally:
        timer.cancel()
        timer.join()
        conn.close()


def _connection(parts, deadline: _Deadline) -> http.client.HTTPConnection:
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=deadline.remaining(),
                                           context=ssl.create_default_context())
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=deadline.remaining())


def _read_body(response, policy: MediaPolicy, deadline: _Deadline, kind: str, param: str | None) -> bytes:
    length = response.getheader("Content-Length")
    if length and length.isdigit() and int(length) > policy.max_media_bytes:
        raise _too_large(kind, param, policy)
    chunks, size = [], 0
    while chunk := response.read1(_READ_BYTES):  # read1: one recv, so the deadline is checked often
        chunks.append(chunk)
        size += len(chunk)
        if size > policy.max_media_bytes:
            raise _too_large(kind, param, policy)
        if deadline.passed:
            raise TimeoutError
    if deadline.passed:  # the timer's shutdown reads as an end of stream
        raise TimeoutError
    if length and length.isdigit() and size != int(length):
        raise MediaSourceError(f"the {kind} URL's body ended after {size} of {length} bytes", kind=kind, param=param)
    return b"".join(chunks)


def _shut(conn: http.client.HTTPConnection) -> None:
    """The deadline passed: wake a recv blocked on this connection (it then fails)."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _too_large(kind: str, param: str | None, policy: MediaPolicy) -> MediaSourceError:
    return MediaSourceError(f"the {kind} at the URL is larger than the limit of {policy.max_media_bytes} bytes",
                            kind=kind, param=param)
