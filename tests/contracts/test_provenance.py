"""The copy filter: each record of the sink taken once, whatever attempts of its batch the log shows."""

from hypothesis import given
from hypothesis import strategies as st

from contracts.provenance import HEADER, CopyFilter, Provenance, header_prefix, parse, provenance_of


def header(writer: str, batch: int, attempt: str, seq: int) -> list[tuple[str, bytes]]:
    return [("dlq.reason", b"x"), (HEADER, f"{header_prefix(writer, batch, attempt)}{seq}".encode())]


def test_a_header_value_round_trips_and_anything_else_is_no_provenance() -> None:
    assert parse(b"features-1a2b-3/17/9f3a/1204") == Provenance("features-1a2b-3", 17, "9f3a", 1204)
    assert parse("a/b/c/5/x/7") == Provenance("a/b/c", 5, "x", 7)  # the writer may hold slashes
    for junk in (None, b"", b"1/2/3", b"w/x/a/1", b"w/1/a/", b"\xff\xfe/1/a/2/"):
        assert parse(junk) is None
    assert provenance_of(None) is None and provenance_of([("other", b"1")]) is None
    assert provenance_of({HEADER: b"w/1/a/2"}) == Provenance("w", 1, "a", 2)


def test_an_aborted_attempts_records_are_taken_once_with_the_rest_of_the_rerun() -> None:
    """Attempt a wrote positions 0, 3 of batch 7 in this partition and died; attempt b wrote 0, 3, 5, 8."""
    log = [("w", 6, "z", 9), ("w", 7, "a", 0), ("w", 7, "a", 3), ("v", 2, "q", 0)]
    log += [("w", 7, "b", 0), ("w", 7, "b", 3), ("w", 7, "b", 5), ("w", 7, "b", 8), ("w", 8, "c", 1)]
    copies = CopyFilter()
    taken = [r for r in log if not copies.is_copy("t/0", header(*r))]
    kept = [("w", 6, 9), ("w", 7, 0), ("w", 7, 3), ("v", 2, 0), ("w", 7, 5), ("w", 7, 8), ("w", 8, 1)]
    assert [(w, b, s) for w, b, _, s in taken] == kept
    assert copies.copies == 2
    assert not copies.is_copy("t/0", [("other", b"")]), "records of other producers are always taken"
    assert copies.is_copy("t/0", header("w", 7, "d", 8)), "an older batch of a writer is a copy"


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=6),
    st.integers(0, 1_000),
)
def test_a_restarted_filter_judges_as_one_that_ran_on(cut_points: list[int], cut: int) -> None:
    """Marks saved at any point (the Spark source keeps them in its offsets) continue the judgement."""
    log = []
    for batch, stop in enumerate(cut_points):  # each batch: an aborted attempt up to ``stop``, then the whole
        log += [("w", batch, "a", seq) for seq in range(stop)]
        log += [("w", batch, "b", seq) for seq in range(40)]
    at = cut % (len(log) + 1)
    whole = CopyFilter()
    expected = [whole.is_copy("p", header(*r)) for r in log]
    first = CopyFilter()
    before = [first.is_copy("p", header(*r)) for r in log[:at]]
    second = CopyFilter({"p": first.marks("p")})
    assert before + [second.is_copy("p", header(*r)) for r in log[at:]] == expected
    assert expected.count(False) == 40 * len(cut_points)
