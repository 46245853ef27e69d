"""The dashboard's observability panel (admin/static/observe.js) in Chromium: the slow-subscriber ranking names
the client that acks late (paho, `manual_ack=True`), its hostile client id shown as text, and the client counters
table counts what each client sent and received."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.admin.test_api_trace import _manual_ack_subscriber
from tests.admin.test_dashboard_browser import _wait, browser  # noqa: F401  (the Chromium fixture)
from tests.integration.conftest import Gateway, PahoClient

webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium 4")
from selenium.webdriver.chrome.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

LATE = "late <b>acker</b>"  # markup in a client id must stay text


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Gateway]:
    with Gateway(tmp_path / "gw", admin=True, env={"TIDEWIRE_SLOW_SUBSCRIBERS_THRESHOLD_MS": "50"}) as gw:
        yield gw


def _rows(driver: WebDriver, table: str) -> dict[str, list[str]]:
    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-client-id]")
    return {str(r.get_attribute("data-client-id")): [c.text for c in r.find_elements(By.TAG_NAME, "td")]
            for r in rows}


@pytest.mark.slow  # a browser, a node and three clients: seconds
def test_dashboard_shows_the_slow_subscriber_and_client_counters(node: Gateway, browser: WebDriver) -> None:  # noqa: F811
    late, late_got = _manual_ack_subscriber(node, LATE, 0.2)
    prompt, _ = _manual_ack_subscriber(node, "prompt", 0)
    publisher = PahoClient(node.port, "dash-publisher")
    try:
        publisher.connect()
        for i in range(3):
            assert publisher.publish("tr/slow", f"m{i}".encode(), qos=1) == 0
        browser.get(f"http://127.0.0.1:{node.admin_port}/#token={node.api_token}")
        _wait(browser, "the late acker ranked alone", lambda d: list(_rows(d, "slow-subscribers")) == [LATE])
        assert _rows(browser, "slow-subscribers")[LATE][5] == "3"  # acks
        assert browser.find_elements(By.CSS_SELECTOR, "#slow-subscribers b") == []
        _wait(browser, "every client counted", lambda d: set(_rows(d, "client-stats")) == {
            LATE, "prompt", "dash-publisher"})
        counts = _rows(browser, "client-stats")
        assert counts["dash-publisher"][1:4] == ["3", "6", "0"]  # messages in, payload bytes in, messages out
        assert counts["prompt"][3] == "3" and counts[LATE][3] == "3"
        assert len(late_got) == 3
    finally:
        publisher.close()
        for client in (late, prompt):
            client.disconnect()
            client.loop_stop()
