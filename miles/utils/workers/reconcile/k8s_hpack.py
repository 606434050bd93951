"""HPACK, the header compression of HTTP/2 (RFC 7541). Go: golang.org/x/net/http2/hpack.

``StaticEncoder`` writes the requests' header blocks from the static table alone; ``HeaderDecoder``
reads the server's, keeping its dynamic table. Huffman strings are decoded a byte at a time
through the states of the code's tree, each (state, byte) step worked out once per decoder when
first met: the apiserver's answers carry a fresh Huffman-coded ``audit-id`` each, which ``hpack``'s
decoder read four bits at a time for about 18 us of the 24 us a block cost it (cProfile), the
largest part of what HTTP/2 added to the client's CPU per write over HTTP/1.1.
"""

from __future__ import annotations

from collections.abc import Sequence

STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = (
    (b":authority", b""), (b":method", b"GET"), (b":method", b"POST"), (b":path", b"/"),
    (b":path", b"/index.html"), (b":scheme", b"http"), (b":scheme", b"https"),
    (b":status", b"200"), (b":status", b"204"), (b":status", b"206"), (b":status", b"304"),
    (b":status", b"400"), (b":status", b"404"), (b":status", b"500"), (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"), (b"accept-language", b""), (b"accept-ranges", b""),
    (b"accept", b""), (b"access-control-allow-origin", b""), (b"age", b""), (b"allow", b""),
    (b"authorization", b""), (b"cache-control", b""), (b"content-disposition", b""),
    (b"content-encoding", b""), (b"content-language", b""), (b"content-length", b""),
    (b"content-location", b""), (b"content-range", b""), (b"content-type", b""), (b"cookie", b""),
    (b"date", b""), (b"etag", b""), (b"expect", b""), (b"expires", b""), (b"from", b""),
    (b"host", b""), (b"if-match", b""), (b"if-modified-since", b""), (b"if-none-match", b""),
    (b"if-range", b""), (b"if-unmodified-since", b""), (b"last-modified", b""), (b"link", b""),
    (b"location", b""), (b"max-forwards", b""), (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""), (b"range", b""), (b"referer", b""), (b"refresh", b""),
    (b"retry-after", b""), (b"server", b""), (b"set-cookie", b""),
    (b"strict-transport-security", b""), (b"transfer-encoding", b""), (b"user-agent", b""),
    (b"vary", b""), (b"via", b""), (b"www-authenticate", b""),
)  # fmt: skip
"""RFC 7541 Appendix A, index 1 first."""

HUFFMAN_CODE_LENGTHS: tuple[int, ...] = (
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
)  # fmt: skip
"""RFC 7541 Appendix B: the bit length of each symbol's code (256 is EOS). The code is canonical
(codes of one length are consecutive, in symbol order, after the shorter ones), so the lengths
define it."""

_STATIC_TEXT = tuple(
    (name.decode("latin-1"), value.decode("latin-1")) for name, value in STATIC_TABLE
)

DEFAULT_TABLE_SIZE = 4096
"""``SETTINGS_HEADER_TABLE_SIZE`` until a peer says otherwise (RFC 9113 6.5.2); this side never
says otherwise, so the server's dynamic table is at most this."""
_EOS = 256
_ENTRY_OVERHEAD = 32
_BLOCKS_HELD = 4096


class HpackError(Exception):
    """A header block that breaks RFC 7541: HTTP/2's ``COMPRESSION_ERROR``, the connection's end."""


def _build_tree() -> tuple[tuple[int, ...], tuple[int, ...], frozenset[int]]:
    """The code's tree: each internal node's child by bit 0 and by bit 1 (a node id, or ``-1 -
    symbol`` for a leaf), and the nodes a string may end on (the root, or up to seven 1-bits into
    EOS's code: RFC 7541 5.2's padding)."""
    by_bit: list[list[int]] = [[0, 0]]
    code, previous = 0, 0
    for symbol in sorted(range(_EOS + 1), key=lambda s: (HUFFMAN_CODE_LENGTHS[s], s)):
        length = HUFFMAN_CODE_LENGTHS[symbol]
        code = (code + 1) << (length - previous) if previous else 0
        previous = length
        node = 0
        for shift in range(length - 1, 0, -1):
            bit = code >> shift & 1
            if not by_bit[node][bit]:
                by_bit.append([0, 0])
                by_bit[node][bit] = len(by_bit) - 1
            node = by_bit[node][bit]
        by_bit[node][code & 1] = -1 - symbol
    ends, node = {0}, 0
    for _ in range(7):
        node = by_bit[node][1]
        ends.add(node)
    zero, one = zip(*by_bit, strict=True)
    return zero, one, frozenset(ends)


_ZERO, _ONE, _ENDS = _build_tree()


def _step(state: int, byte: int) -> tuple[bytes, int]:
    """The symbols a byte completes from ``state`` and the state it leaves."""
    out = bytearray()
    for shift in range(7, -1, -1):
        state = (_ONE if byte >> shift & 1 else _ZERO)[state]
        if state < 0:
            if state == -1 - _EOS:
                raise HpackError("EOS inside a Huffman-coded string")
            out.append(-1 - state)
            state = 0
    return bytes(out), state


class HuffmanDecoder:
    """RFC 7541 5.2's Huffman-coded strings to their bytes, each (state, byte) step held once
    worked out (at most 256 x 256)."""

    def __init__(self) -> None:
        self._steps: dict[int, tuple[bytes, int]] = {}

    def decode(self, data: bytes) -> bytes:
        steps, state, out = self._steps, 0, []
        for byte in data:
            key = state << 8 | byte
            try:
                emitted, state = steps[key]
            except KeyError:
                emitted, state = steps[key] = _step(state, byte)
            out.append(emitted)
        if state not in _ENDS:
            raise HpackError("a Huffman-coded string padded with other than EOS's first bits")
        return b"".join(out)


def _integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """RFC 7541 5.1: the integer whose prefix is in ``block[at]``, and where it ends."""
    limit = (1 << prefix_bits) - 1
    value = block[at] & limit
    at += 1
    if value < limit:
        return value, at
    for shift in range(0, 28, 7):  # Go's decoder also refuses what needs more than 4 bytes more
        if at >= len(block):
            raise HpackError("a header block ends inside an integer")
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    raise HpackError("an integer over 2**28 in a header block")


class HeaderDecoder:
    """The server's header blocks, in order (each changes the dynamic table the next reads)."""

    def __init__(self, *, max_table_size: int = DEFAULT_TABLE_SIZE) -> None:
        self._limit = max_table_size
        self._capacity = max_table_size
        self._table: list[tuple[str, str]] = []  # newest last
        self._size = 0
        self._huffman = HuffmanDecoder()

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The block's fields, names and values read as Latin-1 (the bytes, one to a char)."""
        fields: list[tuple[str, str]] = []
        at, end = 0, len(block)
        while at < end:
            first = block[at]
            if first & 0x80:
                index = first & 0x7F
                if 0 < index <= len(_STATIC_TEXT):
                    fields.append(_STATIC_TEXT[index - 1])
                    at += 1
                    continue
                index, at = _integer(block, at, 7)
                fields.append(self._field(index))
            elif first & 0x40:
                name_value, at = self._literal(block, at, 6)
                self._add(name_value)
                fields.append(name_value)
            elif first & 0x20:
                if fields:
                    raise HpackError("a dynamic table size update after a field")
                size, at = _integer(block, at, 5)
                self._resize(size)
            else:
                name_value, at = self._literal(block, at, 4)
                fields.append(name_value)
        return fields

    def _field(self, index: int) -> tuple[str, str]:
        if 0 < index <= len(_STATIC_TEXT):
            return _STATIC_TEXT[index - 1]
        dynamic = index - len(_STATIC_TEXT)
        if index == 0 or dynamic > len(self._table):
            raise HpackError(f"header table index {index} out of range")
        return self._table[-dynamic]

    def _literal(self, block: bytes, at: int, prefix_bits: int) -> tuple[tuple[str, str], int]:
        index, at = _integer(block, at, prefix_bits)
        if index:
            name = self._field(index)[0]
        else:
            name, at = self._string(block, at)
        value, at = self._string(block, at)
        return (name, value), at

    def _string(self, block: bytes, at: int) -> tuple[str, int]:
        if at >= len(block):
            raise HpackError("a header block ends before a string")
        huffman = block[at] & 0x80
        length, at = _integer(block, at, 7)
        if at + length > len(block):
            raise HpackError("a header block ends inside a string")
        raw = block[at : at + length]
        text = self._huffman.decode(raw) if huffman else raw
        return text.decode("latin-1"), at + length

    def _add(self, entry: tuple[str, str]) -> None:
        self._table.append(entry)
        self._size += len(entry[0]) + len(entry[1]) + _ENTRY_OVERHEAD
        self._evict()

    def _resize(self, size: int) -> None:
        if size > self._limit:
            raise HpackError(f"a dynamic table size of {size} over the {self._limit} allowed")
        self._capacity = size
        self._evict()

    def _evict(self) -> None:
        """RFC 7541 4.4: the oldest entries go until the table fits; an entry larger than the
        whole table empties it (and is not kept)."""
        evicted = 0
        while self._size > self._capacity:
            name, value = self._table[evicted]
            self._size -= len(name) + len(value) + _ENTRY_OVERHEAD
            evicted += 1
        if evicted:
            del self._table[:evicted]


_STATIC_FIELDS = {field: index for index, field in enumerate(STATIC_TABLE, 1)}
_STATIC_NAMES: dict[bytes, int] = {}
for _index, (_name, _) in enumerate(STATIC_TABLE, 1):
    _STATIC_NAMES.setdefault(_name, _index)


class StaticEncoder:
    """HPACK that never indexes a field into the dynamic table: a field of the static table by
    its index, any other as a literal (its name by index where the static table has it), no
    Huffman coding. Its blocks depend on the fields alone, so each is made once (at most
    ``_BLOCKS_HELD`` held): ``hpack``'s encoder searched its tables for every field of every
    request, a tenth of the client's CPU per write (cProfile). Go's encoder indexes; the
    apiserver decodes either alike."""

    def __init__(self) -> None:
        self._blocks: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
        self._resized = False

    @property
    def header_table_size(self) -> int:
        return 0

    @header_table_size.setter
    def header_table_size(self, _: int) -> None:
        self._resized = True  # the next block opens with a size update (to 0, always allowed)

    def encode(self, headers: Sequence[tuple[bytes, bytes]], huffman: bool = True) -> bytes:
        key = tuple(headers)
        block = self._blocks.get(key)
        if block is None:
            if len(self._blocks) >= _BLOCKS_HELD:
                self._blocks.clear()
            block = self._blocks[key] = b"".join(_field(name, value) for name, value in key)
        if self._resized:
            self._resized = False
            return b"\x20" + block
        return block


def _field(name: bytes, value: bytes) -> bytes:
    index = _STATIC_FIELDS.get((name, value))
    if index is not None:
        return _encode_integer(index, 7, 0x80)
    index = _STATIC_NAMES.get(name, 0)
    head = _encode_integer(index, 4, 0) if index else b"\x00" + _encode_integer(len(name), 7, 0)
    return head + (b"" if index else name) + _encode_integer(len(value), 7, 0) + value


def _encode_integer(value: int, prefix_bits: int, flags: int) -> bytes:
    """RFC 7541 5.1."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([flags | value])
    out = [flags | limit]
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)
