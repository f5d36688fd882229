"""Structured logging: structlog events with keys (pod, gang, queue, node, cycle).

``json`` writes one JSON object per line to stderr (what log collectors parse); ``console``
writes coloured, aligned lines for people. Standard-library loggers (aiohttp, asyncio,
kubernetes-asyncio) go through the same renderer so a process never mixes formats.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "LogFormat", "setup_logging"]

LogFormat = Literal["json", "console"]
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")


def setup_logging(fmt: LogFormat = "json", level: str = "info") -> None:
    """Configure structlog and the standard library's root logger; idempotent."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} must be one of {', '.join(LOG_FORMATS)}")
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} must be one of {', '.join(LOG_LEVELS)}")
    numeric = getattr(logging, level.upper())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
        shared = [*shared, structlog.processors.dict_tracebacks]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # Access logs for every probe and scrape would drown the scheduler's own events.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
