"""The playground: a chat page at GET / (static HTML, JS and CSS in server/static/playground).

Contract: `install_playground(app)` adds GET / (the page) and GET /static/playground/{name} (its
script, style sheet and icon), and HEAD of each (uptime probes send it), all answered without a
key and while the model loads (the guard's static-file rule: they hold no API data). The page asks for the API key and keeps it in its own
memory; its requests (/info, /metrics, /v1/chat/completions) follow the usual key rule. Every URL
in it is relative, so it works behind a path prefix; no file comes from elsewhere (no CDN, no
build step). POST / stays the TGI route.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse

from server.errors import ApiError

FILES = Path(__file__).parent / "static" / "playground"
ASSET_NAMES = frozenset({"app.js", "style.css", "icon.svg"})  # icon.svg: also ReDoc's logo


def install_playground(app: FastAPI) -> None:
    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)  # HEAD: probes
    async def playground() -> FileResponse:
        return FileResponse(FILES / "index.html", headers={"Cache-Control": "no-cache"})

    @app.api_route("/static/playground/{name}", methods=["GET", "HEAD"], include_in_schema=False)
    async def playground_asset(name: str) -> FileResponse:
        if name not in ASSET_NAMES:  # a fixed list: no path from the URL reaches the disk
            raise ApiError(404, f"no file {name!r} here", code="not_found")
        return FileResponse(FILES / name, headers={"Cache-Control": "no-cache"})
