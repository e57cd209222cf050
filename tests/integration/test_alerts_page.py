"""The live alerts page in headless Chromium (Debian's), served by uvicorn over a real Valkey server.

Opens the page, writes new alerts with ``write_alerts`` while it is open and expects them to appear
within a few polls, then looks a card up with the form and expects its features, score and alerts.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import uvicorn
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from infra.embedded import HOST, StackInfo, free_port
from infra.redis_store import card_features_key, set_latest, write_alerts, write_scores
from scoring.api import create_app
from tests.support.factories import CARD_A, CARD_B, T0_MS, make_alert, make_score

RETENTION_S = 7 * 86_400
WAIT_S = 15


@pytest.fixture
def store(stack: StackInfo) -> Iterator[tuple[Any, str]]:
    client = redis.Redis.from_url(stack.redis_url)
    yield client, f"test-{uuid.uuid4().hex[:10]}:"
    client.close()


@pytest.fixture
def server(store: tuple[Any, str]) -> Iterator[str]:
    """The app on a free loopback port, in a thread of this process."""
    client, prefix = store
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(client, prefix), host=HOST, port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://{HOST}:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def alert_rows(browser: WebDriver) -> list[str]:
    return [
        row.get_attribute("data-tx-id") or ""
        for row in browser.find_elements(By.CSS_SELECTOR, "#alerts tbody tr")
    ]


def test_page_shows_new_alerts_and_looks_up_a_card(
    store: tuple[Any, str], server: str, browser: WebDriver
) -> None:
    client, prefix = store
    write_alerts(client, [make_alert(1)], prefix, RETENTION_S)
    browser.get(server + "/")
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda b: alert_rows(b) == ["1"])
    assert "live" in browser.find_element(By.ID, "status").text

    # New alerts while the page is open: they appear at the top, newest event time first.
    write_alerts(client, [make_alert(2, card_id=CARD_B), make_alert(3, card_id=CARD_B)], prefix, RETENTION_S)
    wait.until(lambda b: alert_rows(b) == ["3", "2", "1"])
    assert CARD_B[:12] in browser.find_element(By.CSS_SELECTOR, "#alerts tbody tr").text

    # Card lookup with the form.
    write_scores(client, [make_score(3, card_id=CARD_B)], prefix, RETENTION_S)
    set_latest(
        client,
        [
            (
                card_features_key(CARD_B, prefix),
                T0_MS + 3000,
                3,
                {"terminal_id": "3156", "amount": 250.5, "late": 0, "card_amount_ratio_30d": 4.25},
            )
        ],
        RETENTION_S,
    )
    field = browser.find_element(By.ID, "card-input")
    field.send_keys(CARD_B)
    browser.find_element(By.CSS_SELECTOR, "#card-form button").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "card-id"), CARD_B))
    assert "0.910" in browser.find_element(By.ID, "card-score").text
    assert "fraud-detector v3" in browser.find_element(By.ID, "card-score").text
    features = browser.find_element(By.ID, "card-features").text
    assert "card_amount_ratio_30d" in features and "4.2500" in features
    card_alerts = browser.find_elements(By.CSS_SELECTOR, "#card-alerts tr")
    assert len(card_alerts) == 3  # header + tx 3 and 2

    # A card the store does not know.
    field.clear()
    field.send_keys(CARD_A.replace("a", "d"))
    browser.find_element(By.CSS_SELECTOR, "#card-form button").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "card-result"), "nothing stored for this card"))
