"""The proxy's log: text for a person, or one JSON object a line (``PCP_LOG_FORMAT=json``) for a collector.

Every line written while a protocol-mode request is served carries its trace
id (``x-pcp-trace``), so the lines of one request can be found together and
beside its trace in the inspector. The id travels in a context variable:
asyncio copies it into the tasks a request starts, ``asyncio.to_thread`` into
its threads.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["TRACE_ID", "JsonFormatter", "configure_logging"]

TRACE_ID: ContextVar[str | None] = ContextVar("pcp_trace_id", default=None)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _TraceId(logging.Filter):
    """Puts the current request's trace id on each record (``record.trace``), or None outside one."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Give the record the trace id of the request it is logged under."""
        if not hasattr(record, "trace"):
            record.trace = TRACE_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the trace id, the record's ``fields`` and any exception."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line."""
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace = getattr(record, "trace", None)
        if trace is None:
            trace = TRACE_ID.get()
        if trace is not None:
            line["trace"] = trace
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update({k: v for k, v in fields.items() if k not in line})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: str, stream: IO[str] | None = None) -> logging.Handler:
    """The root logger's one handler, writing ``fmt`` ("text" or "json") at ``level``; returns it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_TraceId())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
