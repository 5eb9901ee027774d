"""NDJSON framing (sans-IO): body bytes in, numbered lines out.

Lines end with `\\n` (a `\\r` before it is dropped); blank lines are skipped but counted, so a
line number is the one an editor shows. The last line may lack its newline.
"""

from __future__ import annotations

from typing import NamedTuple

from rill.sessions.errors import PayloadTooLarge

CONTENT_TYPE = "application/x-ndjson"


class Line(NamedTuple):
    number: int  # 1-based
    data: bytes


class NdjsonFramer:
    def __init__(self, max_line_bytes: int):
        self.max_line_bytes = max_line_bytes  # the caller may change it between lines
        self.num_lines = 0
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Line]:
        self._buffer += data
        lines = []
        while (end := self._buffer.find(b"\n")) >= 0:
            lines += self._line(bytes(self._buffer[:end]))
            del self._buffer[:end + 1]
        if len(self._buffer) > self.max_line_bytes:
            raise PayloadTooLarge(f"line {self.num_lines + 1} is longer than {self.max_line_bytes} bytes",
                                  code="line_too_long")
        return lines

    def close(self) -> list[Line]:
        """The body ended: its unterminated last line, if any."""
        rest, self._buffer = bytes(self._buffer), bytearray()
        return self._line(rest) if rest.strip() else []

    def _line(self, data: bytes) -> list[Line]:
        self.num_lines += 1
        if len(data) > self.max_line_bytes:
            raise PayloadTooLarge(f"line {self.num_lines} is longer than {self.max_line_bytes} bytes",
                                  code="line_too_long")
        data = data.removesuffix(b"\r")
        return [Line(self.num_lines, data)] if data.strip() else []
