"""Fast layer: ``k8s_hpack`` against ``hpack`` (python-hyper, the test extra's): its tables are
RFC 7541's, the decoder reads whatever ``hpack``'s encoder writes (Huffman or not, indexed into a
dynamic table that evicts, resized) as ``hpack``'s decoder does, every broken block is refused, and
the static encoder's blocks read back the same fields."""

from __future__ import annotations

import hpack
import pytest
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable
from hypothesis import given, settings
from hypothesis import strategies as st

from miles.utils.workers.reconcile.k8s_hpack import (
    HUFFMAN_CODE_LENGTHS,
    STATIC_TABLE,
    HeaderDecoder,
    HpackError,
    HuffmanDecoder,
    StaticEncoder,
)

_HUFFMAN = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)


def test_the_tables_are_rfc_7541s() -> None:
    assert tuple(HeaderTable.STATIC_TABLE) == STATIC_TABLE
    assert list(HUFFMAN_CODE_LENGTHS) == list(REQUEST_CODES_LENGTH)


def test_every_symbol_decodes_alone_and_together() -> None:
    decoder = HuffmanDecoder()
    for symbol in range(256):
        assert decoder.decode(_HUFFMAN.encode(bytes([symbol]))) == bytes([symbol])
    every = bytes(range(256)) * 2
    assert decoder.decode(_HUFFMAN.encode(every)) == every


_names = st.sampled_from(
    [b"audit-id", b"date", b"content-type", b"content-length", b":status", b"warning"]
) | st.binary(min_size=1, max_size=40).map(lambda name: name.lower())
_values = st.binary(max_size=300)
_block = st.lists(st.tuples(_names, _values, st.booleans(), st.booleans()), max_size=12)


@settings(max_examples=150, deadline=None)
@given(blocks=st.lists(st.tuples(_block, st.sampled_from([None, 0, 64, 256, 4096])), max_size=8))
def test_the_decoder_reads_what_hpack_writes_as_hpack_does(
    blocks: list[tuple[list[tuple[bytes, bytes, bool, bool]], int | None]],
) -> None:
    """Fields indexed, literal with and without indexing and never indexed (hpack's encoder
    picks by ``HeaderTuple``/``NeverIndexedHeaderTuple``), Huffman or not, a table resized
    before a block (a size update) and evicting as it fills."""
    encoder, reference, ours = hpack.Encoder(), hpack.Decoder(), HeaderDecoder()
    for fields, resize in blocks:
        if resize is not None:
            encoder.header_table_size = resize
        headers = [
            hpack.NeverIndexedHeaderTuple(name, value) if never else (name, value)
            for name, value, never, _ in fields
        ]
        huffman = any(coded for *_, coded in fields)
        block = encoder.encode(headers, huffman=huffman)
        expected = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in reference.decode(block, raw=True)
        ]
        assert ours.decode(block) == expected


def test_eviction_keeps_the_indexes_the_server_means() -> None:
    """A table of 256 bytes (RFC 7541 C.5's size) through many answers, each with a fresh
    ``audit-id`` and a date that repeats: every block reads as it was written."""
    encoder, ours = hpack.Encoder(), HeaderDecoder()
    encoder.header_table_size = 256
    for n in range(200):
        fields = [
            (b":status", b"201"),
            (b"audit-id", f"{n:08x}-5c2d-4b3e-9d0e-3b1f2a6c7d8e".encode()),
            (b"date", f"Sat, 05 Dec 2026 08:10:{n // 7 % 60:02d} GMT".encode()),
            (b"content-type", b"application/json"),
        ]
        decoded = ours.decode(encoder.encode(fields))
        assert decoded == [(name.decode(), value.decode()) for name, value in fields]


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (b"\x80", "index 0"),
        (b"\xbf", "index 63"),  # the static table's 61 and an empty dynamic table
        (b"\xff\xff\xff\xff\xff\x0f", "over 2\\*\\*28"),
        (b"\xff", "inside an integer"),
        (b"\x40", "before a string"),
        (b"\x04\x05ab", "inside a string"),
        (b"\x3f\xe2\x1f", "size of 4097 over"),
        (b"\x88\x20", "after a field"),
        (b"\x04\x84\xff\xff\xff\xff", "EOS inside"),
        (b"\x04\x81\x00", "padded with other"),  # '0' (00000) then three 0-bits
        (b"\x04\x82\x07\xff", "padded with other"),  # "0" then eleven 1-bits
    ],
)
def test_a_broken_block_is_refused(block: bytes, reason: str) -> None:
    with pytest.raises(HpackError, match=reason):
        HeaderDecoder().decode(block)


def test_the_static_encoder_is_read_back() -> None:
    """Static-table fields by index, other names and values as literals (lengths past a prefix
    in several bytes), a table size update after the server's SETTINGS: ``hpack``'s decoder and
    ours read back the same fields, and ``hpack``'s dynamic table stays empty."""
    fields = [
        (b":method", b"GET"),
        (b":path", b"/api/v1/" + b"n" * 300),
        (b"content-type", b"application/apply-patch+yaml"),
        (b"x-long-name-" + b"a" * 140, b"v" * 200),
    ]
    encoder, reference, ours = StaticEncoder(), hpack.Decoder(), HeaderDecoder()
    first = encoder.encode(fields)
    encoder.header_table_size = 1024
    second = encoder.encode(fields)
    assert second == b"\x20" + first
    assert encoder.encode(fields) is first
    for block in (first, second):
        assert reference.decode(block, raw=True) == fields
        assert ours.decode(block) == [(name.decode(), value.decode()) for name, value in fields]
    assert len(reference.header_table.dynamic_entries) == 0
