"""`normserve models`: the repository of a running server (list, load, unload), and the old layout migrated.

list, load and unload are the repository extension's routes (POST /v2/repository/...), so they
work against any Triton-like server too. They read the settings `normserve serve` reads (app/settings.py): the
server is at NORMSERVE_HOST and NORMSERVE_PORT unless --url says otherwise, and the admin token is --token or
NORMSERVE_ADMIN_TOKEN. migrate works on a folder, with no server and no torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli import http
from app.core.repository import LegacyLayout, Repository, check_name, migrate
from app.errors import InvalidInput
from app.settings import Settings

# A server listening on every address is reached on loopback.
WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def default_url(settings: Settings) -> str:
    """Where `normserve serve` listens with the same settings (NORMSERVE_HOST, NORMSERVE_PORT)."""
    host = WILDCARDS.get(settings.host, settings.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


def _parser(settings: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="normserve models",
        description="The model repository of a running server: list its versions and their states, load or "
        "unload a model (explicit model control); or migrate a folder of the old single-manifest layout.",
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,load,unload,migrate}")
    for action, help_ in (
        ("list", "every version in the repository, with its state and reason"),
        ("load", "load the versions a model's version_policy selects; unload the others once they serve"),
        ("unload", "stop serving every version of a model (requests in flight finish)"),
    ):
        a = sub.add_parser(action, help=help_, description=help_)
        if action != "list":
            a.add_argument("name", help="the model's folder name in the repository")
        url = default_url(settings)
        a.add_argument("--url", default=url, help=f"the server (default {url}: NORMSERVE_HOST and NORMSERVE_PORT)")
        a.add_argument("--token", help="admin token (default: NORMSERVE_ADMIN_TOKEN)")
    m = sub.add_parser("migrate", help="move the old models/manifest.json layout into <name>/1/ folders")
    m.add_argument("--repository", type=Path, default=Path("models"), help="the folder (default: models)")
    return p


def command(argv: list[str]) -> int:
    """Exit 0 when done, 1 when the server refused (a failed load), 2 when it could not be asked."""
    settings = Settings()
    args = _parser(settings).parse_args(argv)
    if args.action == "migrate":
        return _migrate(args.repository)
    token = args.token if args.token is not None else settings.admin_token
    base = args.url.rstrip("/")
    try:
        if args.action == "list":
            _print_index(http.call("POST", f"{base}/v2/repository/index", {}, token))
            return 0
        name = check_name(args.name, "name")
        answer = http.call("POST", f"{base}/v2/repository/models/{name}/{args.action}", {}, token)
    except InvalidInput as e:
        print(f"normserve models: error: {e}", file=sys.stderr)
        return 2
    except http.RequestFailed as e:
        print(f"normserve models: error: {_explained(e, token)}", file=sys.stderr)
        return 1 if e.status == 400 else 2
    if args.action == "load":
        loaded, serving = ", ".join(answer["loaded"]) or "none new", ", ".join(answer["serving"])
        print(f"loaded {name}: version {loaded}; serving {serving}")
    else:
        print(f"unloaded {name}: version {', '.join(answer['unloaded']) or 'none was serving'}")
    return 0


def _explained(e: http.RequestFailed, token: str | None) -> str:
    """The failure, with this command's own fix where it has one (not the server's HTTP words for it)."""
    if e.unreachable:
        return f"{e}; give the server's address with --url (the default is NORMSERVE_HOST and NORMSERVE_PORT)"
    if e.status == 401 and not token:
        return f"{e.request}: HTTP 401: the server requires its admin token: pass --token, or set NORMSERVE_ADMIN_TOKEN"
    return str(e)


def _print_index(rows: list[dict[str, str]]) -> None:
    width = max([len(r["name"]) for r in rows] + [5])
    print(f"{'MODEL':<{width}}  VERSION  {'STATE':<11}  REASON")
    for r in rows:
        print(f"{r['name']:<{width}}  {r['version']:<7}  {r['state']:<11}  {r['reason']}".rstrip())


def _migrate(root: Path) -> int:
    try:
        Repository(root).check_layout()
    except LegacyLayout:
        moved = migrate(root)
        print(f"migrated {root}: {', '.join(moved)}")
        return 0
    except OSError as e:
        print(f"normserve models: error: {e}", file=sys.stderr)
        return 2
    print(f"{root} is already a model repository: nothing to migrate")
    return 0
