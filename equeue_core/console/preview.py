"""Body previews for the message pages: as text, as pretty JSON (when it parses), as a hex dump."""

from __future__ import annotations

import json
from dataclasses import dataclass

PREVIEW_BYTES = 64 * 1024  # a preview shows at most this much of a body


@dataclass(slots=True)
class BodyPreview:
    size: int
    text: str | None  # None when the body is not UTF-8
    json: str | None  # None when the body is not JSON
    hex: str
    truncated: bool

    @property
    def default(self) -> str:
        """The view to show first: JSON if it is JSON, else text if it is text, else hex."""
        return "json" if self.json is not None else "text" if self.text is not None else "hex"


def hex_dump(data: bytes, width: int = 16) -> str:
    """Offset, hex bytes and printable ASCII, `width` bytes a line (like `hexdump -C`)."""
    lines = []
    for off in range(0, len(data), width):
        chunk = data[off:off + width]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {hexes:<{width * 3 - 1}}  |{text}|")
    return "\n".join(lines)


def preview(body: bytes) -> BodyPreview:
    shown = body[:PREVIEW_BYTES]
    try:
        text: str | None = shown.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    pretty = None
    if text is not None and len(body) <= PREVIEW_BYTES:
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
        except ValueError:
            pretty = None
    return BodyPreview(len(body), text, pretty, hex_dump(shown[:4096]), len(body) > len(shown))
