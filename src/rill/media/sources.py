"""Media sources to encoded bytes: uploaded bytes, `data:` URLs, and, where the policy allows them,
http(s) URLs (rill.media.remote) and local files.

A source is one of:
- bytes (bytearray, memoryview): an uploaded file, used as is;
- "data:[<mediatype>][;base64],<data>" (RFC 2397): base64 or percent-encoded bytes;
- "http://..." / "https://...": fetched when the host is in `policy.allowed_media_domains`;
- "file:///abs/path", an absolute path string or an os.PathLike: read when the file, after resolving
  symlinks, lies under `policy.allowed_local_media_path`.
Anything else, and every source past `policy.max_media_bytes`, is a MediaSourceError.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlsplit
from urllib.request import url2pathname

from rill.media.errors import MediaSourceError
from rill.media.policy import MediaPolicy
from rill.media.remote import fetch

_WHITESPACE = re.compile(rb"\s+")


def read_source(source, policy: MediaPolicy, *, kind: str, param: str | None = None) -> bytes:
    """The encoded bytes of `source` (see the module docstring), at most `policy.max_media_bytes`."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _capped(bytes(source), policy, kind, param)
    if isinstance(source, os.PathLike):
        return read_local(os.fspath(source), policy, kind=kind, param=param)
    if not isinstance(source, str):
        raise MediaSourceError(f"a {kind} source must be a URL string or bytes, got {type(source).__name__}",
                               kind=kind, param=param)
    scheme = source.split(":", 1)[0].lower() if ":" in source else ""
    if scheme == "data":
        return read_data_url(source, policy, kind=kind, param=param)
    if scheme in ("http", "https"):
        return fetch(source, policy, kind=kind, param=param)
    if scheme == "file":
        return read_local(_file_url_path(source, kind, param), policy, kind=kind, param=param)
    if source.startswith("/"):
        return read_local(source, policy, kind=kind, param=param)
    raise MediaSourceError(f"the {kind} URL must be a data:, http(s):// or file:// URL, got {_shorten(source)!r}",
                           kind=kind, param=param)


def read_data_url(url: str, policy: MediaPolicy, *, kind: str, param: str | None = None) -> bytes:
    """RFC 2397: the bytes after the comma, base64-decoded when the header ends in ";base64"."""
    header, comma, payload = url[len("data:"):].partition(",")
    if not comma:
        raise MediaSourceError(f"the {kind} data: URL has no ',' before its data", kind=kind, param=param)
    if header.lower().endswith(";base64"):
        data = payload.encode("ascii", "replace")
        data = _WHITESPACE.sub(b"", data)
        if len(data) // 4 * 3 > policy.max_media_bytes + 2:  # refuse before decoding what cannot fit
            raise _too_large(kind, param, policy)
        try:
            decoded = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise MediaSourceError(f"the {kind} data: URL is not valid base64: {exc}", kind=kind, param=param) from None
    else:
        decoded = unquote_to_bytes(payload)
    if not decoded:
        raise MediaSourceError(f"the {kind} data: URL holds no data", kind=kind, param=param)
    return _capped(decoded, policy, kind, param)


def read_local(path: str, policy: MediaPolicy, *, kind: str, param: str | None = None) -> bytes:
    """A file under the allowed root, symlinks resolved first (a link out of the root is refused)."""
    if policy.allowed_local_media_path is None:
        raise MediaSourceError(f"local {kind} files are off on this server (--allowed-local-media-path)",
                               kind=kind, param=param)
    root = Path(policy.allowed_local_media_path).resolve()
    target = Path(path).resolve()
    if not Path(path).is_absolute() or not target.is_relative_to(root):
        raise MediaSourceError(f"the {kind} file {path!r} is outside the allowed local media path",
                               kind=kind, param=param)
    if not target.is_file():  # a directory, a FIFO (whose open would block), a missing file
        raise MediaSourceError(f"the {kind} path {path!r} is not a regular file", kind=kind, param=param)
    try:
        with open(target, "rb") as f:
            data = f.read(policy.max_media_bytes + 1)  # one byte past the cap tells "at" from "over"
    except OSError as exc:
        raise MediaSourceError(f"could not read the {kind} file {path!r}: {exc.strerror}", kind=kind,
                               param=param) from None
    return _capped(data, policy, kind, param)


def _file_url_path(url: str, kind: str, param: str | None) -> str:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise MediaSourceError(f"a file:// {kind} URL must name a local path, got host {parts.netloc!r}",
                               kind=kind, param=param)
    return url2pathname(parts.path)


def _capped(data: bytes, policy: MediaPolicy, kind: str, param: str | None) -> bytes:
    if len(data) > policy.max_media_bytes:
        raise _too_large(kind, param, policy)
    return data


def _too_large(kind: str, param: str | None, policy: MediaPolicy) -> MediaSourceError:
    return MediaSourceError(f"the {kind} is larger than the limit of {policy.max_media_bytes} bytes",
                            kind=kind, param=param)


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
