"""structlog setup: JSON lines for journald when not on a TTY, a console renderer on one."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class _LiveStderr:
    """Whatever `sys.stderr` is at the moment of each write. Binding the object found at setup()
    broke every later line once that object was closed or replaced (pytest's per-test capture,
    a CLI that redirects stderr): "I/O operation on closed file" from inside an action task."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return bool(getattr(sys.stderr, "isatty", lambda: False)())

    def fileno(self) -> int:
        return sys.stderr.fileno()


def setup(level: str = "info", fmt: Literal["auto", "json", "console"] = "auto", stream=None) -> None:  # type: ignore[no-untyped-def]
    # sys.stderr itself is taken live too: the CLI passes it, and tests swap it per test.
    stream = _LiveStderr() if stream is None or stream is sys.stderr else stream
    use_console = fmt == "console" or (fmt == "auto" and hasattr(stream, "isatty") and stream.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=True) if use_console else structlog.processors.JSONRenderer()
    )
    if not use_console and to_journal(stream):
        renderer = _with_priority(renderer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    route_stdlib(_LEVELS[level], renderer, stream)


# Libraries that log through the standard library: aiohttp's access log and its request-handler
# tracebacks ("Error handling request"), asyncio's default exception handler. Without this they
# print plain multi-line tracebacks between the JSON lines, which journald splits into one
# entry per line at the default priority.
STDLIB_LOGGERS = ("aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.client", "aiohttp.internal", "asyncio")


def _client_errors(record: logging.LogRecord) -> bool:
    """aiohttp logs a request it cannot parse (a bad header byte, a line over 8 KB, no Host, an
    unknown Content-Encoding) as "Error handling request" at ERROR with a traceback: anyone who can
    connect wrote error lines at will. It is the client's error, answered 400 already: one info
    line with the reason, no traceback (and none at all below the configured level)."""
    exc = record.exc_info[1] if record.exc_info else None
    if exc is None or record.name != "aiohttp.server":
        return True
    from aiohttp.http_exceptions import HttpProcessingError

    if not isinstance(exc, HttpProcessingError):
        return True
    record.msg = f"{record.getMessage()}: {' '.join(str(exc).split())[:300]}"
    record.args = None
    record.exc_info = record.exc_text = None
    record.levelno, record.levelname = logging.INFO, "INFO"
    return logging.getLogger().isEnabledFor(logging.INFO)


def route_stdlib(level: int, renderer: structlog.typing.Processor, stream) -> None:  # type: ignore[no-untyped-def]
    """Send every standard-library log record through the same renderer as structlog's own
    lines: one JSON line (or console line) with level, logger and timestamp; a traceback becomes
    the line's `exception` field."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_logger_name,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(_client_errors)
    handler.set_name("podhealth")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "podhealth"]:
        root.removeHandler(old)  # setup() again (tests, --log-level) replaces, never doubles
    root.addHandler(handler)
    root.setLevel(level)
    for name in STDLIB_LOGGERS:
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
        lg.setLevel(logging.NOTSET)


# sd-daemon(3) priority prefixes: journald (SyslogLevelPrefix=yes, its default) strips "<N>" from a
# stderr line and files the line at that priority, so `journalctl -p warning` finds warnings.
_PRIORITY = {"critical": 2, "error": 3, "exception": 3, "warning": 4, "warn": 4, "info": 6, "debug": 7}


def to_journal(stream) -> bool:  # type: ignore[no-untyped-def]
    """True when `stream` is the journal stream systemd gave us ($JOURNAL_STREAM = "dev:inode")."""
    import os

    want = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return bool(want) and want == f"{st.st_dev}:{st.st_ino}"


def _with_priority(render: structlog.typing.Processor) -> structlog.typing.Processor:
    def proc(logger, name, event_dict):  # type: ignore[no-untyped-def]
        prio = _PRIORITY.get(str(event_dict.get("level", name)).lower(), 6)
        return f"<{prio}>{render(logger, name, event_dict)}"
    return proc


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
