"""The provenance header of the sink's records: written by one format, read back by it."""

from contracts.provenance import HEADER, Provenance, header_prefix, parse, provenance_of


def test_a_header_value_round_trips_and_anything_else_is_no_provenance() -> None:
    assert parse(b"features-1a2b-3/17/9f3a/1204") == Provenance("features-1a2b-3", 17, "9f3a", 1204)
    assert parse("a/b/c/5/x/7") == Provenance("a/b/c", 5, "x", 7)  # the writer may hold slashes
    for junk in (None, b"", b"1/2/3", b"w/x/a/1", b"w/1/a/", b"\xff\xfe/1/a/2/"):
        assert parse(junk) is None
    assert provenance_of(None) is None and provenance_of([("other", b"1")]) is None
    assert provenance_of({HEADER: b"w/1/a/2"}) == Provenance("w", 1, "a", 2)


def test_a_batch_prefix_and_a_position_make_a_header_value() -> None:
    value = f"{header_prefix('features-1a2b-3', 17, '9f3a')}{1204}".encode()
    assert provenance_of([("dlq.reason", b"x"), (HEADER, value)]) == Provenance(
        "features-1a2b-3", 17, "9f3a", 1204
    )
