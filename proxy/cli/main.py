"""``pcp-proxy serve``: load settings, build the app, run it under uvicorn. ``pcp-proxy sessions list|show ID``: look inside the store."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..logs import configure_logging
from ..settings import Settings, SettingsError, load_settings
from .process import tune_process

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    """The command line: ``serve`` and the sessions' commands."""
    parser = argparse.ArgumentParser(prog="pcp-proxy", description="OpenAI-compatible proxy that pages long conversations.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--host", help="address to listen on (PCP_HOST)")
    serve.add_argument("--port", type=int, help="port to listen on (PCP_PORT)")
    serve.add_argument(
        "--upstream",
        dest="upstream_base_url",
        metavar="URL",
        help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1 (PCP_UPSTREAM_BASE_URL); omit to run the embedded local model",
    )
    serve.add_argument("--workers", type=int, help="processes serving the port, sharing the store (PCP_WORKERS)")
    serve.add_argument("--config", metavar="FILE", help="TOML settings file (PCP_CONFIG)")
    sessions = commands.add_parser("sessions", help="look inside the stored sessions (PCP_DATA_DIR)")
    looks = sessions.add_subparsers(dest="look", required=True)
    listed = looks.add_parser("list", help="every session, latest first")
    shown = looks.add_parser("show", help="one session: its size, its dates and its page tree")
    shown.add_argument("session_id", metavar="ID")
    for look in (listed, shown):
        look.add_argument("--namespace", default="", metavar="PREFIX", help="only the namespace(s) whose hash starts so, as listed")
        look.add_argument("--config", metavar="FILE", help="TOML settings file (PCP_CONFIG)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; its exit status."""
    args = _parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k in ("host", "port", "upstream_base_url", "workers")}
    try:
        settings = load_settings(args.config, overrides=overrides)
    except SettingsError as exc:
        print(f"pcp-proxy: {exc}", file=sys.stderr)
        return 2
    if args.command == "sessions":
        from .sessions import list_sessions, show_session

        return list_sessions(settings, args.namespace) if args.look == "list" else show_session(settings, args.session_id, args.namespace)

    import uvicorn

    from ..app import create_app
    from ..embedded import local_missing
    from .server import server_options

    missing = None if settings.upstream_base_url else local_missing(settings.local_server, settings.local_model)
    if missing:
        print(f"pcp-proxy: no upstream configured (PCP_UPSTREAM_BASE_URL), and for the embedded local model {missing}", file=sys.stderr)
        return 2
    problem = _store_problem(settings)
    if problem:
        print(f"pcp-proxy: {problem}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    # In JSON, uvicorn's own lines go through the root handler too: one format a line.
    own_log: dict[str, Any] = {"log_config": None} if settings.log_format == "json" else {}
    options: dict[str, Any] = {"host": settings.host, "port": settings.port, "log_level": settings.log_level, "access_log": False, **own_log}
    if settings.workers > 1:
        from .workers import serve_workers

        return serve_workers(settings)
    tune_process(settings)
    uvicorn.run(create_app(settings), **options, **server_options(settings))
    return 0


def _store_problem(settings: Settings) -> str | None:
    """Why the store cannot be used (malformed, unreachable, workers without an upstream), told before serving."""
    if settings.workers > 1 and not settings.upstream_base_url:
        return "setting workers (env PCP_WORKERS): more than one worker needs an upstream (upstream_base_url); the embedded local model runs in one process"
    if not settings.store:
        return None
    from ..storage import Stores, StoreSettingError

    try:
        Stores(settings.store, settings.data_path).close()
    except StoreSettingError as error:
        return str(error)
    return None


if __name__ == "__main__":
    sys.exit(main())
