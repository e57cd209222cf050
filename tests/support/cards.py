"""Card numbers for tests: Luhn-valid numbers of every length a card has, written as people write them."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from contracts.privacy import MAX_DIGITS, MIN_DIGITS, luhn_valid


def luhn_complete(body: str) -> str:
    """``body`` with the check digit that makes it Luhn-valid."""
    return next(body + digit for digit in "0123456789" if luhn_valid(body + digit))


#: Luhn-valid numbers of 13 to 19 digits.
card_numbers = st.integers(min_value=MIN_DIGITS - 1, max_value=MAX_DIGITS - 1).flatmap(
    lambda n: st.text("0123456789", min_size=n, max_size=n).map(luhn_complete)
)


def formatted(number: str, separator: str) -> str:
    """``number`` in groups of four digits joined by ``separator``."""
    return separator.join(number[i : i + 4] for i in range(0, len(number), 4))


def random_card_numbers(count: int, seed: int) -> list[str]:
    """``count`` distinct Luhn-valid numbers of 13 to 19 digits (first digit not 0), the same for a seed."""
    rng = random.Random(seed)
    found: set[str] = set()
    while len(found) < count:
        length = rng.randint(MIN_DIGITS, MAX_DIGITS)
        found.add(luhn_complete(str(rng.randint(1, 9)) + "".join(rng.choices("0123456789", k=length - 2))))
    return sorted(found)
