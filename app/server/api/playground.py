"""GET / serves the playground page; /static serves its script and style, shipped inside the package."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.responses import FileResponse
from starlette.staticfiles import StaticFiles

from app.server.http.direct import DirectRoute

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"

# Everything the page loads comes from this origin; the CSP makes a stray CDN link fail loudly in the browser.
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'"

router = APIRouter(include_in_schema=False, route_class=DirectRoute)  # answers HEAD too


@router.get("/")
async def index() -> FileResponse:
    """The playground: normalize or encode a tensor, embed sentences, or read a model's drift monitor, as plots."""
    return FileResponse(
        STATIC_DIR / "index.html",
        media_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )


def install(app: FastAPI) -> None:
    """Add the page and its static files to the app."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
