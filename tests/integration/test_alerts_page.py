"""The live alerts page in headless Chromium (Debian's), served by uvicorn over a real Valkey server.

Opens the page, writes new alerts with ``write_alerts`` while it is open and expects them to appear
within a few polls, then looks a card up with the form and expects its features, score and alerts. Then
the status strip and the charts, at 1280 px, with a registered job and counted scores.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn
from fastapi import FastAPI
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from api.app import create_app
from contracts.redis_keys import card_features_key
from fraud.live import RegisteredJobs
from fraud.metrics import JobMetrics
from fraud.running import registered, this_job
from infra.embedded.stack import HOST, StackInfo, free_port
from infra.redis.store import set_latest, write_alerts, write_scores
from scoring.score_stats import score_stats, write_score_stats
from tests.support.factories import CARD_A, CARD_B, EXPLANATION, T0_MS, make_alert, make_progress, make_score

RETENTION_S = 7 * 86_400
WAIT_S = 15


@pytest.fixture
def store(stack: StackInfo) -> Iterator[tuple[Any, str]]:
    client = redis.Redis.from_url(stack.redis_url)
    yield client, f"test-{uuid.uuid4().hex[:10]}:"
    client.close()


@contextlib.contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """``app`` on a free loopback port, in a thread of this process: its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://{HOST}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def server(store: tuple[Any, str]) -> Iterator[str]:
    client, prefix = store
    with served(create_app(client, prefix)) as url:
        yield url


# The page redraws the alerts table as it polls: what the test reads of a row, it reads in one script (a row
# found in one call may be replaced before the next).


def alert_rows(browser: WebDriver) -> list[str]:
    """The tx ids of the alerts table's rows, top first."""
    script = "return [...document.querySelectorAll('#alerts tbody tr')].map((row) => row.dataset.txId || '');"
    return list(browser.execute_script(script))


NEWEST_ALERT = """
const row = document.querySelector("#alerts tbody tr");
const reasons = row.querySelector("td.top");
return [row.innerText, reasons.innerText, reasons.getAttribute("title") || ""];
"""


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
    newest, reasons, title = browser.execute_script(NEWEST_ALERT)
    assert CARD_B[:12] in newest
    # Its top features with their signed contributions; the method and base margin in the cell's title.
    assert reasons == "card_amount_ratio_30d +1.25, card_nb_tx_1d -0.50"
    assert "(tree_shap), base margin -4.50" in title

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


@pytest.fixture
def live_server(store: tuple[Any, str], tmp_path: Path) -> Iterator[str]:
    """The app with a view of the jobs registered under a home of its own."""
    client, prefix = store
    with served(create_app(client, prefix, jobs=RegisteredJobs(tmp_path))) as url:
        yield url


@pytest.fixture
def scoring_job(tmp_path: Path) -> Iterator[None]:
    """A scoring job's real metrics endpoint after a micro-batch, registered under ``tmp_path``."""
    metrics = JobMetrics("scoring")
    port = metrics.serve(0)
    metrics.on_progress(make_progress(41, read=600, behind=25, duration_ms=500))
    try:
        with registered(tmp_path, this_job("scoring", "", f"http://{HOST}:{port}/metrics", "")):
            yield
    finally:
        metrics.close()


# The strip and the charts are redrawn as the page polls too: read in one script each.


def chart_values(browser: WebDriver, chart: str) -> list[int]:
    """The counts of a chart's bars, in order."""
    script = "return [...document.querySelectorAll(arguments[0])].map((bar) => Number(bar.dataset.value));"
    return list(browser.execute_script(script, f"#{chart} rect.bar"))


def text_of(browser: WebDriver, selector: str) -> str:
    return str(browser.execute_script("return document.querySelector(arguments[0]).innerText;", selector))


THRESHOLD_LEFT_OF_BARS_OVER = """
const line = document.querySelector("#scores-chart line.threshold");
const over = [...document.querySelectorAll("#scores-chart rect.bar.over")];
return [over.length, Number(line.getAttribute("x1")) < Number(over[0].getAttribute("x")) + 1];
"""


#: Elements whose right edge must stay in the window, and whose content must not scroll sideways.
LAID_OUT = "#strip, .tile, figure, svg, main > section, table"

CUT_OFF = """
const width = document.documentElement.clientWidth;
const cut = [];
if (document.documentElement.scrollWidth > width) cut.push("page " + document.documentElement.scrollWidth);
for (const node of document.querySelectorAll(arguments[0])) {
  const box = node.getBoundingClientRect();
  if (box.right > width + 0.5 || node.scrollWidth > node.clientWidth + 1) {
    cut.push((node.id || node.tagName) + " right " + Math.round(box.right) + " scroll " + node.scrollWidth
             + " > " + node.clientWidth);
  }
}
return cut;
"""


def test_status_strip_and_charts_render_with_data_at_1280_px(
    store: tuple[Any, str], live_server: str, scoring_job: None, browser: WebDriver
) -> None:
    """Scores of the last three minutes (every tenth at or above the threshold) and their alerts, counted by
    the scoring job's hook into the real store; a registered scoring job; the page at 1280 px shows the job
    and the model in the strip, each alert in its minute's bar and each score in its bin, the threshold
    line, and nothing cut off, also with a card looked up."""
    client, prefix = store
    now_ms = int(time.time() * 1000)
    alerts = []
    scores = []
    for minute in range(3):
        batch = []
        for i in range(40):
            tx = minute * 100 + i
            score = 0.9 if i % 10 == 0 else (i % 10) / 100
            batch.append(
                make_score(tx, score=score, alert=score >= 0.5, scored_at_ms=now_ms - minute * 60_000)
            )
        scores += batch
        alerts += [s.to_alert({"card_nb_tx_1d": 1.0}, EXPLANATION) for s in batch if s.alert]
    write_alerts(client, alerts, prefix, RETENTION_S)
    stats = score_stats([s.model_dump_json().encode() for s in scores])
    assert write_score_stats(client, stats, prefix, RETENTION_S)

    browser.set_window_size(1280, 1000)
    browser.get(live_server + "/")
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(
        lambda b: (
            len(chart_values(b, "alerts-chart")) == 30
            and len(chart_values(b, "scores-chart")) == 50
            and "rec/s" in text_of(b, "#strip")
        )
    )

    strip = text_of(browser, "#strip").lower()  # the labels are set in capitals
    assert "scoring" in strip and "1,200 rec/s" in strip and "lag 25" in strip and "batch 41" in strip
    model = text_of(browser, "#model")
    assert "fraud-detector v3" in model and "threshold 0.500" in model

    per_minute = chart_values(browser, "alerts-chart")
    assert [n for n in per_minute if n] == [4, 4, 4]  # the last three minutes (or a minute earlier)
    bins = chart_values(browser, "scores-chart")
    assert sum(bins) == 120 and bins[:5] == [12, 24, 24, 24, 24] and bins[45] == 12
    caption = text_of(browser, "#scores-chart figcaption")
    assert "120 scores by fraud-detector v3, 12 at or above the threshold" in caption
    assert browser.execute_script(THRESHOLD_LEFT_OF_BARS_OVER) == [25, True]  # the bins from 0.50 up
    assert browser.execute_script(CUT_OFF, LAID_OUT) == []

    # A card looked up: the right-hand column holds its features and alerts, still inside the window.
    browser.execute_script("document.querySelector('#alerts tbody tr td.card').click();")
    wait.until(ec.presence_of_element_located((By.ID, "card-alerts")))
    assert browser.execute_script(CUT_OFF, LAID_OUT) == []
    screenshot = os.environ.get("FRAUD_PAGE_SCREENSHOT")  # a file to look at the page in
    if screenshot:
        browser.save_screenshot(screenshot)
