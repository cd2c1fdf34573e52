"""Log output for the long-running commands (broker, console): text by default, or one JSON
object a line (`log_format = "json"`, `--log-format json`) for log shippers.

A JSON line has `ts` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `msg`, any structured
fields the call passed with `extra=` (the broker's recovery report, for one), and `exc` with the
traceback when there is one. Text lines are `time LEVEL logger: message`.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from typing import Any, TextIO

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(fmt: str = "text", level: str | None = None, stream: TextIO | None = None) -> None:
    """Set the root handler once, for the process: format `fmt`, level from EQUEUE_LOG_LEVEL or INFO."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level or os.environ.get("EQUEUE_LOG_LEVEL", "INFO"))


def announce(fmt: str, msg: str, **fields: Any) -> None:
    """A start-up line for stdout (what a person or a supervisor waits for): the text as is, or
    in JSON mode the same text as `msg` with the fields beside it."""
    if fmt == "json":
        print(json.dumps({"msg": msg, **fields}, default=str), flush=True)
    else:
        print(msg, flush=True)
