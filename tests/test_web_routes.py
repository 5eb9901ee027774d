"""The web page's routes (transports/web.py) without a browser: GET / and the files it loads are
served from the package, reference nothing outside it, stay open under --api-key (the API does
not), and --no-web-ui leaves them out. tests/test_web_page.py drives the page in Chromium."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import httpx

from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.cli import build_parser
from rill.transports.http import ServerConfig
from rill.transports.web import CONTENT_TYPES, page_files

WEB_DIR = Path(__file__).parents[1] / "src" / "rill" / "web"
# What index.html links (src= / href=) and what the modules import ("./x.js").
REFERENCE = re.compile(r'(?:src|href)="(web/[^"]+)"|from "\./([^"]+)"')


def _references(files: dict[str, tuple[bytes, str]]) -> set[str]:
    found = set()
    for body, _ in files.values():
        for linked, imported in REFERENCE.findall(body.decode()):
            found.add("/" + linked if linked else "/web/" + imported)
    return found


async def test_root_serves_the_page_and_every_file_it_references():
    async with running_server("rill-tiny") as server, httpx.AsyncClient(base_url=server.url) as client:
        page = await client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert '<script type="module" src="web/app.js">' in page.text
        references = _references(page_files())
        assert {"/web/app.js", "/web/style.css", "/web/typeahead.js", "/web/metrics.js"} <= references
        for path in references:
            response = await client.get(path)
            suffix = "." + path.rpartition(".")[2]
            assert response.status_code == 200, path
            assert response.headers["content-type"] == CONTENT_TYPES[suffix], path


def test_the_page_fetches_nothing_from_the_network():
    for path, (body, _) in page_files().items():
        text = body.decode().replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert not re.search(r"https?://|\burl\(|@import", text), f"{path} names an outside address"


async def test_paths_outside_the_page_are_not_files():
    async with running_server("rill-tiny") as server, httpx.AsyncClient(base_url=server.url) as client:
        for path in ("/web/nope.js", "/web/../pyproject.toml", "/web/__init__.py", "/index.html", "/web/"):
            response = await client.get(path)
            assert response.status_code == 404, path
            assert response.json()["error"]["code"] is not None or response.json()["error"]["message"]


async def test_with_an_api_key_the_page_is_open_and_the_api_is_not():
    config = ServerConfig(api_key="sesame")
    async with running_server("rill-tiny", config) as server, httpx.AsyncClient(base_url=server.url) as client:
        for path in ("/", "/web/app.js", "/web/style.css", "/web/icon.svg"):
            assert (await client.get(path)).status_code == 200, path
        for path in ("/v1/models", "/web/nope.js", "/web/app.js/x"):  # only the page's exact paths are open
            assert (await client.get(path)).status_code == 401, path
        models = await client.get("/v1/models", headers={"Authorization": "Bearer sesame"})
        assert models.status_code == 200


async def test_no_web_ui_leaves_root_a_404_as_before():
    async with running_server("rill-tiny", ServerConfig(web_ui=False)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        for path in ("/", "/web/app.js"):
            response = await client.get(path)
            assert response.status_code == 404
            assert response.json()["error"]["type"]
    keyed = ServerConfig(web_ui=False, api_key="sesame")
    async with running_server("rill-tiny", keyed) as server, httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/")).status_code == 401  # as every unknown path with a key


def test_no_web_ui_flag_and_variable(monkeypatch):
    assert build_parser().parse_args(["serve", "--no-web-ui"]).no_web_ui
    assert not build_parser().parse_args(["serve"]).no_web_ui
    assert ServerConfig.from_env().web_ui
    monkeypatch.setenv("RILL_NO_WEB_UI", "1")
    assert not ServerConfig.from_env().web_ui
    assert build_parser().parse_args(["serve"]).no_web_ui


def test_the_package_data_ships_every_file_of_the_page():
    setuptools = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "rill.web" in setuptools["packages"]
    patterns = setuptools["package-data"]["rill.web"]
    shipped = {p.name for pattern in patterns for p in WEB_DIR.glob(pattern)}
    assert shipped == {p.name for p in WEB_DIR.iterdir() if p.suffix in CONTENT_TYPES}
    assert {"index.html", "style.css", "app.js"} <= shipped
