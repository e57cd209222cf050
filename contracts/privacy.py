"""Card numbers are never stored and secrets never shown: anything that looks like a card number is masked
before it is written or shown, and credentials inside URLs are redacted wherever a URL is shown.

The pipeline itself only ever holds card tokens (a keyed hash, ``ingest.tokens``). What can still carry a
card number in clear is input that failed validation (a dead letter keeps the original record), and the
text made from it: dead-letter details, log lines, error messages. They pass through
:func:`mask_card_numbers`.

What looks like a card number: 13 to 19 digits that pass the Luhn check (ISO/IEC 7812), written whole or
in groups separated by single spaces or dashes (a run of digits and separators is checked group by group,
so a number stands out from digits next to it; a run of more than 19 digits without separators is
searched at every position). Every digit of such a number but the last four is replaced by ``*``;
separators and length are kept, so the rest of the record stays readable. A Luhn-valid number of that
length that is not a card (a millisecond timestamp, one time in ten) is masked too: a dead letter loses
a little detail rather than risk a card number.
"""

from __future__ import annotations

import re

#: Card numbers are 13 to 19 digits long (ISO/IEC 7812).
MIN_DIGITS, MAX_DIGITS = 13, 19
#: Digits left visible at the end of a masked number.
VISIBLE_DIGITS = 4
MASK = "*"

#: Runs of at least MIN_DIGITS digits, a single space or dash allowed between two digits.
_RUN = re.compile(rf"(?<![0-9])[0-9](?:[ -]?[0-9]){{{MIN_DIGITS - 1},}}(?![0-9])")
_RUN_BYTES = re.compile(_RUN.pattern.encode())


def luhn_valid(digits: str) -> bool:
    """Whether a string of digits passes the Luhn check."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _candidates(groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Digit ranges [start, stop) that could be one card number, in a run whose separators split its
    digits into ``groups`` (digit ranges): every sequence of whole consecutive groups of 13 to 19 digits
    (cards are written in groups), and inside a group longer than 19 digits, every window of 13 to 19."""
    found = []
    for first in range(len(groups)):
        for last in range(first, len(groups)):
            length = groups[last][1] - groups[first][0]
            if length > MAX_DIGITS:
                break
            if length >= MIN_DIGITS:
                found.append((groups[first][0], groups[last][1]))
    for start, stop in groups:
        if stop - start > MAX_DIGITS:
            found += [
                (at, at + length)
                for at in range(start, stop - MIN_DIGITS + 1)
                for length in range(MIN_DIGITS, min(MAX_DIGITS, stop - at) + 1)
            ]
    return found


def _masked_run(run: str) -> str:
    """A run of digits and separators with every card number inside it masked."""
    positions = [i for i, char in enumerate(run) if char.isdigit()]
    digits = "".join(run[i] for i in positions)
    groups, start = [], 0
    for k in range(1, len(positions) + 1):
        if k == len(positions) or positions[k] != positions[k - 1] + 1:
            groups.append((start, k))
            start = k
    hidden = [False] * len(digits)
    for first, stop in _candidates(groups):
        if luhn_valid(digits[first:stop]):
            for k in range(first, stop - VISIBLE_DIGITS):
                hidden[k] = True
    if not any(hidden):
        return run
    chars = list(run)
    for k, hide in enumerate(hidden):
        if hide:
            chars[positions[k]] = MASK
    return "".join(chars)


def mask_card_numbers(text: str) -> str:
    """``text`` with every card number in it masked (all but the last four digits)."""
    if len(text) < MIN_DIGITS:
        return text
    return _RUN.sub(lambda match: _masked_run(match.group()), text)


def mask_card_numbers_bytes(raw: bytes) -> bytes:
    """:func:`mask_card_numbers` of raw bytes (any encoding that writes digits as ASCII)."""
    if len(raw) < MIN_DIGITS:
        return raw
    return _RUN_BYTES.sub(lambda match: _masked_run(match.group().decode("ascii")).encode("ascii"), raw)


def redact_url(url: str) -> str:
    """``url`` without the password it may carry (``redis://user:secret@host``, ``https://user:pw@mlflow``)."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}" if user else f"{scheme}{sep}***@{host}"
