"""`rill nginx-config`: print an nginx configuration that puts rill replicas behind one address.

    rill nginx-config --listen 0.0.0.0:8000 --replica a=10.0.0.1:8000 --replica b=10.0.0.2:8000

The output goes inside nginx's `http { }` (e.g. /etc/nginx/conf.d/rill.conf). Each replica runs
`rill serve --replica-id NAME`, so the ids of its sessions and stored responses start with "NAME."
(rill.scaling.replica). The configuration
- sends a call whose path names such an id (/v1/streaming_input/sessions/NAME.…,
  /v1/responses/NAME.…) to that replica, and /_rill/replica/NAME/… (a replica's redirect for ids in a
  body) to that replica without the prefix;
- spreads everything else over all replicas, least connections first; a replica that refuses the
  connection is skipped (nothing was sent yet, so even a POST moves on) and rested for fail_timeout;
- streams: no response buffering (SSE events leave as they are made), no request buffering (a Mode A
  NDJSON upload reaches the replica line by line), no body size limit of nginx's own (the replica's
  --max-body-bytes applies), read and send timeouts of an hour, HTTP/1.1 and keepalive to the replicas;
- upgrades /v1/realtime (and any path asking for it) to a WebSocket;
- answers 503 in OpenAI's error shape when the replica a call belongs to is unreachable (its sessions
  are gone with it) or when no replica is.

nginx has no sticky state here: the ids carry the route. Only nginx's own directives are used (no
njs, no Lua, no nginx-plus).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from rill.scaling.replica import REPLICA_PATH, ROUTED_HEADER, SEPARATOR, check_name

# Paths that name a replica's state right after a fixed prefix.
ID_PATHS = ("/v1/streaming_input/sessions/", "/v1/responses/")
STREAM_TIMEOUT = "3600s"  # an SSE answer or a realtime connection may be quiet this long
FAIL_TIMEOUT = "10s"  # a replica that refused a connection gets no new calls for this long


@dataclass(frozen=True)
class Replica:
    name: str
    address: str  # host:port

    @property
    def upstream(self) -> str:
        return f"rill_replica_{self.name.replace('-', '_')}"


def parse_replica(text: str) -> Replica:
    name, eq, address = text.partition("=")
    if not eq or not address:
        raise argparse.ArgumentTypeError(f"--replica {text!r}: expected NAME=HOST:PORT")
    try:
        check_name(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    _check_address(address, "--replica")
    return Replica(name, address)


def _check_address(address: str, flag: str) -> str:
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c in address for c in " ;{}'\""):
        raise argparse.ArgumentTypeError(f"{flag} {address!r}: expected HOST:PORT")
    return address


def listen_address(text: str) -> str:
    return _check_address(text, "--listen")


def render(listen: str, replicas: list[Replica]) -> str:
    """The whole configuration, for an http{} include."""
    names = [r.name for r in replicas]
    if len(set(names)) != len(names):
        raise ValueError(f"replica names must differ: {names}")
    upstreams = [r.upstream for r in replicas]
    if len(set(upstreams)) != len(upstreams):
        raise ValueError(f"replica names must differ after '-' becomes '_' (nginx names): {names}")
    parts = [_header(listen, replicas), _upstreams(replicas), _maps(replicas), _server(listen)]
    return "\n".join(parts)


def _header(listen: str, replicas: list[Replica]) -> str:
    lines = [f"#   {r.name} at {r.address}" for r in replicas]
    return "\n".join(["# rill behind nginx: include inside http { }. Made by `rill nginx-config`; replicas:",
                      *lines, f"# Clients use http://{listen}.", ""])


def _upstreams(replicas: list[Replica]) -> str:
    everyone = [f"    server {r.address} max_fails=1 fail_timeout={FAIL_TIMEOUT};" for r in replicas]
    out = ["upstream rill_all {", "    least_conn;", *everyone, "    keepalive 64;", "}"]
    for r in replicas:  # one server alone is never marked down: its calls get the 503 below instead
        out += [f"upstream {r.upstream} {{", f"    server {r.address};", "    keepalive 16;", "}"]
    return "\n".join(out) + "\n"


def _maps(replicas: list[Replica]) -> str:
    owner = ['map $uri $rill_owner {  # the replica a path belongs to: NAME from an id "NAME.…"', '    default "";']
    for r in replicas:
        for prefix in ID_PATHS:
            owner.append(f'    "~^{_regex(prefix + r.name + SEPARATOR)}" {r.name};')
        owner.append(f'    "~^{_regex(REPLICA_PATH + r.name)}/" {r.name};')
    owner.append("}")
    upstream = ["map $rill_owner $rill_upstream {", "    default rill_all;",
                *[f"    {r.name} {r.upstream};" for r in replicas], "}"]
    message = ["map $rill_owner $rill_unreachable {",
               f'    default {_quote(_error_json("no rill replica is reachable; retry later", "no_replica"))};',
               *[f"    {r.name} {_quote(_error_json(_gone(r.name), 'replica_unreachable'))};" for r in replicas], "}"]
    upgrade = ["map $http_upgrade $rill_connection {  # WebSocket upgrade; otherwise keepalive to the replica",
               "    default upgrade;", '    "" "";', "}"]
    return "\n".join(owner + upstream + message + upgrade) + "\n"


def _gone(name: str) -> str:
    return (f"replica {name}, which holds this session or response, is not reachable: "
            "its streaming sessions and stored responses are lost with it; start a new one")


def _error_json(message: str, code: str) -> str:
    return json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": code}})


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _regex(path: str) -> str:
    return "".join("\\" + c if c in ".^$*+?()[]{}|\\" else c for c in path)


def _proxy(uri: str = "", extra: list[str] = ()) -> list[str]:
    """The proxy directives of a location (nginx inherits proxy_set_header only as a whole: each
    location that sets one sets them all)."""
    return [
        f"        proxy_pass http://$rill_upstream{uri};",
        "        proxy_http_version 1.1;",
        "        proxy_set_header Host $host;",
        "        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "        proxy_set_header X-Forwarded-Proto $scheme;",
        "        proxy_set_header Upgrade $http_upgrade;",
        "        proxy_set_header Connection $rill_connection;",
        *extra,
    ]


def _server(listen: str) -> str:
    out = [
        "server {",
        f"    listen {listen};",
        "    client_max_body_size 0;  # the replica's --max-body-bytes applies",
        "    proxy_buffering off;  # SSE: each event leaves as the replica sends it",
        "    proxy_request_buffering off;  # Mode A NDJSON: each line reaches the replica as it arrives",
        f"    proxy_read_timeout {STREAM_TIMEOUT};",
        f"    proxy_send_timeout {STREAM_TIMEOUT};",
        "    proxy_next_upstream error timeout;  # a refused connection: the next replica (nothing was sent)",
        "    error_page 502 504 = @rill_unreachable;",
        "",
        "    location / {",
        *_proxy(),
        "    }",
        # A replica's 307 for ids in a body: to the owner (the map reads it from this path), prefix removed.
        f"    location ~ ^{_regex(REPLICA_PATH)}[A-Za-z0-9_-]+(?<rill_path>/.*)$ {{",
        *_proxy("$rill_path$is_args$args", [f"        proxy_set_header {ROUTED_HEADER} 1;"]),
        "    }",
        "    location @rill_unreachable {",
        "        default_type application/json;",
        "        return 503 $rill_unreachable;",
        "    }",
        "}",
    ]
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rill nginx-config", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True, type=listen_address, help="HOST:PORT nginx listens on")
    p.add_argument("--replica", required=True, action="append", type=parse_replica, metavar="NAME=HOST:PORT",
                   help="a replica started with `rill serve --replica-id NAME`; repeat for each")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        text = render(args.listen, args.replica)
    except ValueError as exc:
        parser.error(str(exc))
    sys.stdout.write(text)
    return 0
