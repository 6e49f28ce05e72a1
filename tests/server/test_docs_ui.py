"""/docs (Swagger UI) and /redoc (ReDoc): served from the package's files, no CDN, with the key
rule of /openapi.json.

Oracles: the pages' own HTML (every URL it loads is relative and answered by this server with
the library it names); the server's /openapi.json (the document the pages point at); the
guard's rule as /openapi.json follows it, with and without --api-key and --public-routes.
"""

from __future__ import annotations

import re
from urllib.parse import urljoin

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

KEY = {"Authorization": "Bearer secret"}
# page -> (the OpenAPI attribute naming the document, what its main script defines)
PAGES = {"/docs": ("url: '", "SwaggerUIBundle"), "/redoc": ('spec-url="', "Redoc")}


def loaded_urls(html: str) -> list[str]:
    """Every URL the page loads: scripts, stylesheets, icons."""
    return re.findall(r'(?:src|href)="([^"]+)"', html)


@pytest.fixture(scope="module")
def server():
    with LiveServer(FakeEngine) as live:
        yield live


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_docs_page_loads_only_files_this_server_ships(server, page):
    response = httpx.get(server.url + page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    urls = loaded_urls(response.text)
    assert len(urls) >= 2, response.text  # the library and the favicon at least
    script = ""
    for url in urls:
        assert not re.match(r"[a-z]+:|//|/", url), f"{url} is not relative: no CDN, any prefix"
        asset = httpx.get(urljoin(server.url + page, url))
        assert asset.status_code == 200 and len(asset.content) > 1000, url
        if url.endswith(".js"):
            script = asset.text
    attribute, library = PAGES[page]
    assert library in script[:5000]
    spec = response.text.split(attribute, 1)[1].split(attribute[-1], 1)[0]
    document = httpx.get(urljoin(server.url + page, spec)).json()
    assert document == httpx.get(server.url + "/openapi.json").json()
    assert not {"/docs", "/redoc"} & set(document["paths"])


def test_redoc_loads_its_footer_logo_from_this_server(server):
    """ReDoc renders an <img> whose address is in its bundle: Redocly's CDN as shipped."""
    bundle = httpx.get(server.url + "/static/docs/redoc.standalone.js").text
    images = re.findall(r'"img",\{[^}]*src:"([^"]+)"', bundle)
    assert images, "the scan finds ReDoc's images"
    for src in images:
        assert not re.match(r"[a-z]+:|//|/", src), f"{src}: not from this server"
        assert httpx.get(urljoin(server.url + "/redoc", src)).status_code == 200, src


def test_an_unknown_asset_name_is_a_404_and_reads_nothing(server):
    for name in ("nothing.js", "..%2F..%2Fapp.py", "%2Fetc%2Fpasswd"):
        assert httpx.get(f"{server.url}/static/docs/{name}").status_code == 404, name


def test_the_pages_follow_the_key_rule_of_openapi_json():
    with LiveServer(FakeEngine, api_key=("secret",)) as live:
        for path in ("/openapi.json", *PAGES):
            assert httpx.get(live.url + path).status_code == 401, path
            assert httpx.get(live.url + path, headers=KEY).status_code == 200, path
        html = httpx.get(live.url + "/docs", headers=KEY).text
        for url in loaded_urls(html):  # library files: the browser sends no key for them
            assert httpx.get(urljoin(live.url + "/docs", url)).status_code == 200, url


def test_pages_listed_as_public_open_without_a_key():
    public = ("/docs", "/redoc", "/openapi.json", "/health")
    with LiveServer(FakeEngine, api_key=("secret",), public_routes=public) as live:
        for path in ("/openapi.json", *PAGES):
            assert httpx.get(live.url + path).status_code == 200, path
        assert httpx.post(live.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
