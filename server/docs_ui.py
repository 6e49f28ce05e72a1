"""/docs (Swagger UI) and /redoc (ReDoc) on the OpenAPI document, from assets a package ships.

Contract: `install_docs(app)` adds GET /docs and GET /redoc, pages that follow the key and
readiness rule of /openapi.json (the guard's: a key is needed unless the route is listed in
`--public-routes`, and 503 while the model loads), and GET /static/docs/{name}: the Swagger UI
and ReDoc bundles the `fastapi-offline` package ships (its MIT licence; Swagger UI is
Apache-2.0, ReDoc MIT). Those files are library code with no API data, answered without a key
and while loading (the guard's static-file rule). Every URL in the pages is relative, so they
work behind a path prefix, and none leaves the server: no CDN, no web fonts (ReDoc's bundle is
served with its footer logo's CDN address replaced by tgserve's icon, a relative URL). The routes stay out
of the OpenAPI document.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import FileResponse, HTMLResponse, Response

from server.errors import ApiError

ASSETS = Path(fastapi_offline.__file__).parent / "static"
ASSET_NAMES = frozenset({"swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"})
ASSET_NAMES |= {"favicon.png"}
_ASSET_URL = "static/docs/{name}"  # relative to /docs and /redoc
_REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"


def install_docs(app: FastAPI, openapi_url: str) -> None:
    """Adds /docs, /redoc and their assets; `openapi_url` is the document's route."""
    spec = openapi_url.lstrip("/")  # relative: the pages sit beside it
    favicon = _ASSET_URL.format(name="favicon.png")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=spec,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=_ASSET_URL.format(name="swagger-ui-bundle.js"),
            swagger_css_url=_ASSET_URL.format(name="swagger-ui.css"),
            swagger_favicon_url=favicon,
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=spec,
            title=f"{app.title} - ReDoc",
            redoc_js_url=_ASSET_URL.format(name="redoc.standalone.js"),
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        )

    redoc_bundle = _redoc_without_cdn()

    @app.get("/static/docs/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        if name not in ASSET_NAMES:  # a fixed list: no path from the URL reaches the disk
            raise ApiError(404, f"no file {name!r} here", code="not_found")
        if name == "redoc.standalone.js":
            return Response(redoc_bundle, media_type="text/javascript")
        return FileResponse(ASSETS / name)


def _redoc_without_cdn() -> bytes:
    """ReDoc's bundle with its footer logo (an <img> ReDoc always renders, fetched from
    Redocly's CDN) taken from this server instead: tgserve's icon, beside the pages."""
    bundle = (ASSETS / "redoc.standalone.js").read_bytes()
    if _REDOC_CDN_LOGO not in bundle:  # a ReDoc release without it: nothing to replace
        return bundle
    return bundle.replace(_REDOC_CDN_LOGO, b"static/playground/icon.svg")
