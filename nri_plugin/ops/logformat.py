"""Log line formats: ``text`` (one human line) or ``json`` (one JSON object per line, for
log shippers). Chosen by ``log.format`` in the configuration."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_LINE = 4096  # characters of one log message; the rest is cut, saying how much


def clip(text: str, limit: int) -> str:
    # Imported here: nri_plugin.nri.wire loads the NRI messages and protobuf, which
    # ``nri-cdi refresh`` (run at boot, before containerd) and ``watch`` never need.
    from nri_plugin.nri.wire import clip as clip_text

    return clip_text(text, limit)


class ClippedFormatter(logging.Formatter):
    """Tracebacks cut like messages (they quote the exception)."""

    def formatException(self, ei: Any) -> str:
        return clip(super().formatException(ei), MAX_LINE * 4)


class JsonFormatter(ClippedFormatter):
    """``{"time", "level", "logger", "message"}`` plus ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_text:
            entry["exception"] = record.exc_text
        elif record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def log_formatter(kind: str) -> logging.Formatter:
    """The formatter for ``log.format``: ``json``, else ``text`` (the settings allow no other)."""
    return JsonFormatter() if kind == "json" else ClippedFormatter(TEXT_FORMAT)


def log_to(handler: logging.Handler, level: str, kind: str) -> None:
    """Every log record to ``handler`` alone, from ``level`` (``log.level``) up, in the
    ``log.format`` ``kind``."""
    handler.setFormatter(log_formatter(kind))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


MAX_SITES = 1024  # call sites counted; beyond, the counts start again


class BoundedLog(logging.Filter):
    """Bounds what the plugin logs, whatever the input (attach it to the handler).

    * every message is cut to ``max_chars`` (a refusal may quote a 2 MB name);
    * lines from the same call site (logger, level and format string) beyond ``burst``
      per ``window`` seconds are dropped and counted; the next line from that site after
      the window says how many were dropped. A flood of rejected requests then costs a
      few lines per window instead of one per request. The loggers in ``unlimited`` are
      never dropped: fail-closed names every container it stops, refuses or reports (each
      once, so their number is that of the containers).

    It formats the message itself (``msg`` becomes the bounded text, ``args`` None): the
    handler's formatter then only adds the time, level and logger.
    """

    def __init__(self, max_chars: int = MAX_LINE, burst: int = 20, window: float = 10.0,
                 clock: Any = time.monotonic, unlimited: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.unlimited = unlimited
        self.max_chars = max_chars
        self.burst = burst
        self.window = window
        self.clock = clock
        self._sites: dict[tuple[str, int, str], list[float]] = {}  # [window start, n, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in self.unlimited:
            self._bound(record, 0)
            return True
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = self.clock()
        site = self._sites.get(key)
        if site is None or now - site[0] >= self.window:
            dropped = int(site[2]) if site is not None else 0
            if site is None and len(self._sites) >= MAX_SITES:
                self._sites.clear()  # pathological: messages without a fixed format
            site = self._sites[key] = [now, 0, 0]
        else:
            dropped = 0
        site[1] += 1
        if site[1] > self.burst:
            site[2] += 1
            return False
        self._bound(record, dropped)
        return True

    def _bound(self, record: logging.LogRecord, dropped: int) -> None:
        message = record.getMessage()
        if len(message) > self.max_chars:
            message = clip(message, self.max_chars)
        if dropped:
            message += f" [{dropped} similar line(s) dropped in the last {self.window:.0f} s]"
        record.msg, record.args = message, None
