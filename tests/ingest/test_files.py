from pathlib import Path

import pandas as pd
import pytest

from contracts.events import Reason, TxColumns
from ingest.files import InputFileError, clean_table, parse_mapping, read_table

C = TxColumns

HANDBOOK_CSV = """TRANSACTION_ID,TX_DATETIME,CUSTOMER_ID,TERMINAL_ID,TX_AMOUNT,TX_TIME_SECONDS,TX_FRAUD
0,2018-04-01 00:00:31,596,3156,57.16,31,0
1,2018-04-01 00:02:10,4961,3412,81.51,130,1
2,2018-04-01 00:07:56,2,1365,146.004,476,0
"""


def test_handbook_mapping_reads_naive_times_as_utc(tmp_path: Path) -> None:
    path = tmp_path / "handbook.csv"
    path.write_text(HANDBOOK_CSV)
    clean = clean_table(read_table(path, parse_mapping("handbook")), "file")
    assert clean.dead_letters == []
    frame = clean.frame
    assert frame[C.TX_ID].tolist() == [0, 1, 2]
    assert frame[C.EVENT_TIME].tolist() == [1_522_540_831_000, 1_522_540_930_000, 1_522_541_276_000]
    assert frame[C.CARD_ID].tolist() == ["596", "4961", "2"]
    assert frame[C.TERMINAL_ID].tolist() == ["3156", "3412", "1365"]
    assert frame[C.AMOUNT].tolist() == [57.16, 81.51, 146.0]  # rounded to cents
    assert frame[C.IS_FRAUD].tolist() == [0, 1, 0]
    assert "TX_TIME_SECONDS" not in frame.columns


def test_zoned_times_are_converted_to_utc(tmp_path: Path) -> None:
    path = tmp_path / "zoned.csv"
    path.write_text(
        "tx_id,card_id,terminal_id,amount,event_time\n"
        "1,c,t,1.0,2018-04-01T02:00:00+02:00\n"
        "2,c,t,1.0,2018-04-01T00:00:00Z\n"
    )
    clean = clean_table(read_table(path, parse_mapping("canonical")), "file")
    assert clean.frame[C.EVENT_TIME].tolist() == [1_522_540_800_000, 1_522_540_800_000]


def test_epoch_milliseconds_in_a_csv_are_times_too(tmp_path: Path) -> None:
    path = tmp_path / "epoch.csv"
    path.write_text(
        "tx_id,card_id,terminal_id,amount,event_time\n"
        "1,c,t,1.0,1522540800000\n"
        "2,c,t,1.0,2018-04-01T00:00:01Z\n"
        "3,c,t,1.0, 1522540802000.0 \n"
        "4,c,t,1.0,1522540803000.5\n"
        "5,c,t,1.0,15225408O3000\n"
    )
    clean = clean_table(read_table(path, parse_mapping("canonical")), "file")
    assert clean.frame[C.EVENT_TIME].tolist() == [1_522_540_800_000, 1_522_540_801_000, 1_522_540_802_000]
    assert [(letter.reason, letter.source) for letter in clean.dead_letters] == [
        (Reason.WRONG_TYPE, "file:row 4"),  # a fraction of a millisecond
        (Reason.WRONG_TYPE, "file:row 5"),  # a letter O among the digits
    ]


def test_parquet_with_aware_datetimes(tmp_path: Path) -> None:
    path = tmp_path / "tx.parquet"
    pd.DataFrame(
        {
            "tx_id": [5],
            "card_id": [7],
            "terminal_id": [9],
            "amount": [1.239],
            "event_time": pd.to_datetime(["2018-04-01 00:00:01"]).tz_localize("UTC"),
        }
    ).to_parquet(path)
    frame = clean_table(read_table(path, {}), "file").frame
    assert frame[C.EVENT_TIME].tolist() == [1_522_540_801_000]
    assert frame[C.AMOUNT].tolist() == [1.24]


def test_unreadable_rows_become_dead_letters_and_others_survive(tmp_path: Path) -> None:
    path = tmp_path / "mixed.csv"
    path.write_text(
        "tx_id,card_id,terminal_id,amount,event_time\n"
        "1,c,t,1.0,2018-04-01 00:00:00\n"
        "2,c,t,abc,2018-04-01 00:00:00\n"
        "3,c,,1.0,2018-04-01 00:00:00\n"
        "4,c,t,1.0,not a date\n"
        "x5,c,t,1.0,2018-04-01 00:00:00\n"
        "6,c,t,2.0,2018-04-02 00:00:00\n"
    )
    clean = clean_table(read_table(path, {}), "file:mixed.csv")
    assert clean.frame[C.TX_ID].tolist() == [1, 6]
    assert clean.frame["source_row"].tolist() == [1, 6]
    reasons = {letter.source: letter.reason for letter in clean.dead_letters}
    assert reasons == {
        "file:mixed.csv:row 2": Reason.WRONG_TYPE,
        "file:mixed.csv:row 3": Reason.MISSING_FIELD,
        "file:mixed.csv:row 4": Reason.WRONG_TYPE,
        "file:mixed.csv:row 5": Reason.WRONG_TYPE,
    }
    letter = next(d for d in clean.dead_letters if d.source.endswith("row 2"))
    assert b'"abc"' in letter.raw
    assert "amount" in letter.detail


def test_missing_required_column_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "short.csv"
    path.write_text("tx_id,card_id,amount\n1,2,3\n")
    with pytest.raises(InputFileError, match=r"missing column\(s\) terminal_id, event_time"):
        read_table(path, {})


def test_custom_mapping_and_bad_mapping() -> None:
    assert parse_mapping("ID=tx_id, WHEN=event_time") == {"ID": C.TX_ID, "WHEN": C.EVENT_TIME}
    with pytest.raises(InputFileError, match="bad mapping entry"):
        parse_mapping("ID=transaction")
    with pytest.raises(InputFileError, match="bad mapping entry"):
        parse_mapping("nonsense")


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "tx.xlsx"
    path.write_text("")
    with pytest.raises(InputFileError, match="unknown table format"):
        read_table(path, {})
