"""A JSON file's top-level array or object read one value at a time, in bounded memory.

WebShop's full `items_shuffle.json` is one JSON list of 1.18M products (several GB); `json.load`
holds all of it, and its Python objects, at once. `iter_array` and `iter_object` read the file
in chunks and decode one element at a time with `json.JSONDecoder.raw_decode`, so memory holds
one chunk plus the element being decoded. Each element is the value `json.loads` gives for it
(a test checks them against `json.loads` on chunks of a few bytes).

A file that is not JSON, or whose top level is not the kind asked for, fails with
`NotJSONError` in one line naming the file and the line; a syntax error midway fails where
it is reached (the elements before it have been yielded).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20
"""Bytes read from the file at a time."""
_TAIL = 16
"""A value that ends, or fails to decode, this close to the end of what has been read may be
cut by the chunk's end (`12|.5`, `tr|ue`, `"\\u00|e9"`): the next chunk is read and it is
decoded again. A decode error further off is the file's own."""
_WHITESPACE = " \t\n\r"
_DECODER = json.JSONDecoder()


class NotJSONError(ValueError):
    """A file that is not JSON, or not the JSON kind expected; says which file and where."""


class _Reader:
    """A file's text, decoded from UTF-8 chunk by chunk; `pos` is the next character."""

    def __init__(self, path: Path, chunk_bytes: int):
        self.path, self.chunk_bytes = path, chunk_bytes
        self.file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos = "", 0
        self.eof = False
        self.bytes_read = 0
        self.lines_before = 0  # newlines in the text already dropped from `buf`

    def close(self) -> None:
        self.file.close()

    def more(self) -> bool:
        """Append the next chunk to the buffer (dropping what was consumed); False at EOF."""
        if self.eof:
            return False
        if self.pos:
            self.lines_before += self.buf.count("\n", 0, self.pos)
            self.buf, self.pos = self.buf[self.pos :], 0
        block = self.file.read(self.chunk_bytes)
        self.bytes_read += len(block)
        try:
            self.buf += self.utf8.decode(block, final=not block)
        except UnicodeDecodeError as e:
            raise self.error(f"not UTF-8 text ({e.reason})", len(self.buf)) from None
        self.eof = not block
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end of the file)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def expect(self, chars: str, what: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            found = repr(c) if c else "the end of the file"
            raise self.error(f"expected {what}, found {found}", self.pos)
        self.pos += 1
        return c

    def value(self) -> Any:
        """Decode the JSON value at the cursor, reading more while it may be cut short."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                cut = e.msg.startswith("Unterminated string") or e.pos >= len(self.buf) - _TAIL
                if cut and self.more():
                    continue
                raise self.error(e.msg, e.pos) from None
            # a value that ends near the buffer's end may go on in the next chunk ("12|.5")
            if end < len(self.buf) - _TAIL or not self.more():
                self.pos = end
                return value

    def error(self, message: str, at: int) -> NotJSONError:
        line = self.lines_before + self.buf.count("\n", 0, at) + 1
        return NotJSONError(f"{self.path}: not JSON ({message}, line {line})")


def _open(path: str | Path, opening: str, expected: str, chunk_bytes: int) -> _Reader:
    reader = _Reader(Path(path), chunk_bytes)
    first = reader.peek()
    if first != opening:
        reader.close()
        kinds = {"[": "a list", "{": "an object", '"': "a string"}
        literal = bool(first) and first in "-0123456789tfn"
        found = kinds.get(first) or ("a number or literal" if literal else None)
        if found is None:
            where = "an empty file" if not first else repr(first)
            raise NotJSONError(f"{path}: not JSON (expected {expected}, found {where}, line 1)")
        raise NotJSONError(f"{path}: expected {expected}, got {found}")
    reader.pos += 1
    return reader


def _end(reader: _Reader) -> None:
    if reader.peek():
        raise reader.error("extra data after the top-level value", reader.pos)


def iter_array(
    path: str | Path, what: str = "values", chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[Any, int]]:
    """(element, bytes of the file read so far) for each element of the top-level array;
    `what` names the elements in the error for another top level ("a list of products")."""
    reader = _open(path, "[", f"a list of {what}", chunk_bytes)
    try:
        if reader.peek() == "]":
            reader.pos += 1
        else:
            while True:
                yield reader.value(), reader.bytes_read
                if reader.expect(",]", "',' or ']' after a list element") == "]":
                    break
        _end(reader)
    finally:
        reader.close()


def iter_object(
    path: str | Path, what: str = "values", chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[str, Any]]:
    """(key, value) for each member of the top-level object, in file order (a repeated key
    comes again; read into a dict, the last one wins, as with `json.loads`); `what` names
    the members in the error for another top level ("an object of asin -> attributes")."""
    reader = _open(path, "{", f"an object of {what}", chunk_bytes)
    try:
        if reader.peek() == "}":
            reader.pos += 1
        else:
            while True:
                if reader.peek() != '"':
                    raise reader.error("expected a member name in double quotes", reader.pos)
                key = reader.value()
                reader.expect(":", "':' after a member name")
                yield key, reader.value()
                if reader.expect(",}", "',' or '}' after an object member") == "}":
                    break
        _end(reader)
    finally:
        reader.close()
