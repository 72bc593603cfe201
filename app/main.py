"""`uvicorn app.main:app` serves normserve; the app is built by app/server/app.py."""

from __future__ import annotations

from app.server.app import create_app

app = create_app()

__all__ = ["app", "create_app"]
