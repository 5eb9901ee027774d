"""Web pages against the keyless server: Host checks (DNS rebinding), Origin checks (cross-site
requests and WebSocket upgrades), and CORS, off unless `--allowed-origins` names origins.

Without `--api-key` anything that reaches the port may generate, and a browser is such a thing:
- DNS rebinding: a page at http://evil.example:8000 re-resolves its own name to 127.0.0.1, and its
  script then talks to rill as a same-origin server, reading every answer. Its requests carry
  `Host: evil.example:8000`, so a Host that is not a name this server is reached by is refused (403).
  Allowed: any IP literal (a rebound name is never one), `localhost` and `*.localhost` (browsers
  resolve them to loopback themselves, RFC 6761), the name `--host` binds to, and `--allowed-hosts`
  (`*`: any). As Ollama and vLLM decided, the check is on for a loopback bind (the default) or a
  bind to a name, and off for a bind to every interface or to another address unless
  `--allowed-hosts` is given: such a server is reached by names rill cannot know (container and
  service names, LAN names), and an operator who exposes it should set a key.
- Cross-site requests: a page on another origin may send a "simple" POST (text/plain, no preflight)
  and open a WebSocket (no CORS at all): the server would generate, and a WebSocket's answers are
  readable. A request that carries an `Origin` is refused (403) unless that origin's host is the
  request's own host (the web page rill serves at /) or `--allowed-origins` lists it.
- CORS (`--allowed-origins`): preflights from a listed origin get 204 with the methods and headers
  it asks for; answers to it carry `Access-Control-Allow-Origin`. Off by default: no CORS header.

With `--api-key` the Host and Origin checks are off, as Ollama (its Host check applies only to a
loopback bind) and the rebinding fixes of other local servers decided: a rebound or cross-site page
cannot send the key (a bearer header is never sent by the browser on its own, unlike a cookie), so
the key already refuses it, and a keyed server is the one reached by names rill cannot know (behind
a proxy, a load balancer, a tunnel). CORS still follows `--allowed-origins`.

Requests without Host or Origin (curl, the SDKs, servers) are not browsers' and pass.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

ANY = "*"
UNCHECKED_PATHS = frozenset({"/health"})  # liveness probes name the pod or service; /health reveals nothing
PREFLIGHT_MAX_AGE_S = 600
ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"


@dataclass(frozen=True)
class Refused:
    """A request refused for where it comes from: 403 with an OpenAI error body."""

    code: str  # host_not_allowed | origin_not_allowed
    message: str
    status: int = 403


@dataclass(frozen=True)
class CrossSitePolicy:
    """The checks; `enforce` is False with an API key (then only CORS headers are added)."""

    enforce: bool = True
    allowed_hosts: frozenset[str] = frozenset()  # names without port, lowercased; ANY: every name
    allowed_origins: frozenset[str] = frozenset()  # "scheme://host[:port]", lowercased; ANY: every origin

    @classmethod
    def make(cls, *, api_key: str | None, allowed_hosts: Iterable[str] = (),
             allowed_origins: Iterable[str] = ()) -> CrossSitePolicy:
        return cls(api_key is None, frozenset(_name(h) for h in allowed_hosts if h.strip()),
                   frozenset(_origin_key(o) for o in allowed_origins if o.strip()))

    def refusal(self, path: str, headers: Mapping[str, str]) -> Refused | None:
        """Why a request (or WebSocket upgrade) with these lowercased headers is refused, or None."""
        if not self.enforce or path in UNCHECKED_PATHS:
            return None
        host = headers.get("host")
        if host is not None and not self.host_allowed(host):
            return Refused("host_not_allowed", f"this server is not reached by the name {_host_name(host)!r} "
                           "(DNS rebinding?); start it with --allowed-hosts NAME to allow it")
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host):
            return Refused("origin_not_allowed", f"requests from the web origin {origin!r} are refused; start the "
                           "server with --allowed-origins ORIGIN to allow it")
        return None

    def host_allowed(self, host: str) -> bool:
        name = _host_name(host)
        return (ANY in self.allowed_hosts or _is_ip(name) or name == "localhost" or name.endswith(".localhost")
                or name in self.allowed_hosts)

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        if self.cors_allows(origin):
            return True
        parts = urlsplit(origin.strip())
        return host is not None and bool(parts.hostname) and _name(parts.hostname) == _host_name(host)

    def cors_allows(self, origin: str | None) -> bool:
        return origin is not None and (ANY in self.allowed_origins or _origin_key(origin) in self.allowed_origins)

    def cors_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        """Headers an answer to `origin` carries (none unless --allowed-origins lists it)."""
        if not self.cors_allows(origin):
            return []
        return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]

    def preflight_headers(self, origin: str, request_headers: str | None) -> list[tuple[bytes, bytes]]:
        asked = (request_headers or "authorization, content-type").encode("latin-1")
        return [*self.cors_headers(origin), (b"access-control-allow-methods", ALLOW_METHODS.encode()),
                (b"access-control-allow-headers", asked),
                (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode())]


def hosts_for_bind(host: str, allowed_hosts: Iterable[str] = ()) -> tuple[str, ...]:
    """`rill serve`'s allowed Host names: --allowed-hosts, and the name --host binds to. A bind to
    every interface or to a non-loopback address allows every name (ANY) unless --allowed-hosts is
    given; a loopback bind, or a bind to a name, is checked."""
    given, name = tuple(allowed_hosts), _name(host.strip("[]"))
    if name == "localhost" or (_is_ip(name) and ipaddress.ip_address(name).is_loopback):
        return given
    if name and not _is_ip(name):
        return (*given, host)
    return given or (ANY,)  # every interface ("", 0.0.0.0, ::) or another address


def _host_name(host: str) -> str:
    """A Host header's name: lowercased, without port or brackets or a trailing dot."""
    host = host.strip()
    if host.startswith("["):  # [v6]:port
        return _name(host[1:host.find("]")] if "]" in host else host[1:])
    if host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return _name(host)


def _name(name: str) -> str:
    return name.strip().lower().rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _origin_key(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


# -- the HTTP side: ASGI middleware (WebSocket upgrades are checked by the realtime hub, for both listeners)


def guard(app, policy: CrossSitePolicy):
    """Wrap an ASGI app: refuse by Host and Origin before the app (or its body) is touched, answer CORS
    preflights from allowed origins, and add CORS headers to their answers."""

    async def asgi_app(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        refused = policy.refusal(scope["path"], headers)
        if refused is not None:
            return await _answer(send, refused.status, _error_body(refused), [(b"content-type", b"application/json")])
        origin = headers.get("origin")
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers and policy.cors_allows(origin):
            return await _answer(send, 204, b"", policy.preflight_headers(origin, headers.get(
                "access-control-request-headers")))
        extra = policy.cors_headers(origin)
        return await app(scope, receive, send if not extra else _adding(send, extra))

    return asgi_app


def _adding(send, extra: list[tuple[bytes, bytes]]):
    async def send_with_headers(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return send_with_headers


async def _answer(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _error_body(refused: Refused) -> bytes:
    import msgspec

    from rill.openai.errors import ApiError

    return msgspec.json.encode(ApiError(refused.status, refused.message, code=refused.code).body)
