"""GET /docs (Swagger UI) with its script and style served from here: no CDN, so it works offline.

FastAPI's own docs page loads Swagger UI from a CDN and is blank without one. The package fastapi-offline
ships the bundle (and a favicon); /docs/assets serves its files, and the page is FastAPI's own HTML pointed
at them. ReDoc is left out: its bundle loads its logo from its vendor's CDN whatever it is given.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from app.server.http.direct import DirectRoute

ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS = "/docs/assets"
# The page's inline bootstrap script needs 'unsafe-inline'; anything from another origin still fails loudly.
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'"
)

router = APIRouter(include_in_schema=False, route_class=DirectRoute)  # answers HEAD too


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI on the app's OpenAPI document, under the root path the app is served at."""
    root = request.scope.get("root_path", "")
    page = get_swagger_ui_html(
        openapi_url=root + (request.app.openapi_url or "/openapi.json"),
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS}/favicon.png",  # FastAPI's default is on its website
    )
    page.headers["Content-Security-Policy"] = CSP
    return page


def install(app: FastAPI) -> None:
    """Add /docs and its assets; the app is built with docs_url=None (and redoc_url=None: ReDoc needs a CDN)."""
    app.include_router(router)
    app.mount(ASSETS, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
