import re

import pandas as pd

from contracts.events import CARD_TOKEN_PATTERN
from ingest.tokens import card_token, tokenise


def test_token_is_deterministic_keyed_and_matches_the_schema() -> None:
    token = card_token("4111111111111111", b"key-a")
    assert token == card_token("4111111111111111", b"key-a")
    assert token != card_token("4111111111111111", b"key-b")
    assert token != card_token("4111111111111112", b"key-a")
    assert re.fullmatch(CARD_TOKEN_PATTERN, token)
    assert "4111" not in token


def test_tokenise_column_equals_one_by_one() -> None:
    refs = pd.Series([3, 1, 3, 2])
    tokens = tokenise(refs, b"k")
    assert tokens.tolist() == [card_token(str(r), b"k") for r in refs]
