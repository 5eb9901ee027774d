"""GET /: the web page (chat, type-ahead over /v1/realtime, a live panel from /metrics).

The page is plain files shipped in the package (src/rill/web): HTML, CSS and JavaScript modules,
no build step. They are read once when the app is made and served from memory under fixed paths,
so no request path ever reaches the file system. The files carry no secret: with `--api-key` they
stay open (the page asks for the key and sends it on its own API calls), exactly these paths and
no prefix, so a crafted path cannot fall outside the key check. `--no-web-ui` leaves them out: 404.
"""

from __future__ import annotations

from importlib import resources

from quart import Response, request
from quart_trio import QuartTrio

PACKAGE = "rill.web"
INDEX_PATH = "/"
FILES_PREFIX = "/web/"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Everything the page loads or connects to is this server: the CSP makes a stray external URL fail
# loudly in the browser (and in the browser tests) instead of quietly reaching the network.
CONTENT_SECURITY_POLICY = ("default-src 'self'; connect-src 'self'; img-src 'self'; style-src 'self'; "
                           "script-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def page_files() -> dict[str, tuple[bytes, str]]:
    """URL path -> (body, content type) for every file of the page: index.html at /, the rest under /web/."""
    files = {}
    for entry in resources.files(PACKAGE).iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in CONTENT_TYPES:
            path = INDEX_PATH if entry.name == "index.html" else FILES_PREFIX + entry.name
            files[path] = (entry.read_bytes(), CONTENT_TYPES[suffix])
    return files


def install_web(app: QuartTrio) -> frozenset[str]:
    """Serve the page; return its paths (they need no API key)."""
    files = page_files()

    async def serve_file() -> Response:
        body, content_type = files[request.path]
        return Response(body, content_type=content_type, headers={
            "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    for path in files:
        app.add_url_rule(path, f"web:{path}", serve_file, methods=["GET"])
    return frozenset(files)
