"""The dashboard in a real headless Chromium (selenium) against a real node: without a token it says so; with
`/#token=...` it shows live rates and the connection count from real paho clients, renders client ids as text
(never markup), finds a client by search and kicks it (the paho client is disconnected, the row goes)."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Gateway, PahoClient

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT = 10.0  # s for anything the page shows (it polls every 1-2 s)
SCREENSHOT_COPY = Path("/work/main/.helpers/dashboard.png")
MQTT5_ADMINISTRATIVE_ACTION = 0x98

pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                                reason=f"needs {CHROMIUM} and {CHROMEDRIVER} (Debian packages chromium, "
                                       "chromium-driver)")

webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium 4")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,1000", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, to catch JS errors
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER),
                                      log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Gateway]:
    with Gateway(tmp_path / "gw", admin=True) as gw:
        yield gw


@pytest.fixture
def mqtt(node: Gateway) -> Iterator[Callable[[str], PahoClient]]:
    """`mqtt(client_id)` -> a connected MQTT 5 paho client of `node` (closed at teardown)."""
    made: list[PahoClient] = []

    def connect(client_id: str) -> PahoClient:
        c = PahoClient(node.port, client_id)
        made.append(c)
        c.connect()
        return c

    yield connect
    for c in made:
        c.close()


class Publisher:
    """One paho client publishing QoS 0 messages every few ms from a thread until stopped."""

    def __init__(self, client: PahoClient, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(0.01):
            self.client.publish(self.topic, f"m{n}".encode(), qos=0, wait=False)
            n += 1

    def __enter__(self) -> Publisher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def _text(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def _number(text: str) -> float:
    m = re.match(r"\s*([0-9.]+)\s*([kM]?)", text)
    if m is None:
        return -1.0
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6}[m.group(2)]


def _row_ids(driver: WebDriver) -> list[str]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#clients tbody tr[data-client-id]")
    return [str(r.get_attribute("data-client-id")) for r in rows]


def _wait(driver: WebDriver, what: str, condition: Callable[[WebDriver], bool]) -> None:
    # The dashboard re-renders its tables on every refresh: an element read between two renders is stale, which
    # is a reason to look again, not a failure.
    WebDriverWait(driver, WAIT, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)).until(
        condition, message=f"dashboard: {what}")


def test_dashboard_live_rates_search_and_kick(node: Gateway, browser: WebDriver,
                                               mqtt: Callable[[str], PahoClient], tmp_path: Path) -> None:
    base = f"http://127.0.0.1:{node.admin_port}"
    browser.get(base + "/")
    _wait(browser, "asks for a token", lambda d: _text(d, "auth-message") == "token required")

    hostile = '<img src=x onerror="document.title=1">&amp;'
    ids = ["dash-a", "dash-b", hostile]
    clients = {cid: mqtt(cid) for cid in ids}
    publisher = mqtt("dash-pub")

    with Publisher(publisher, "dash/topic"):
        # A fragment navigation (no reload): the page picks the token up from the new hash.
        browser.get(f"{base}/#token={node.api_token}")
        _wait(browser, "accepts the token", lambda d: _text(d, "auth-message") == "")
        assert node.api_token not in browser.current_url  # taken out of the address bar
        _wait(browser, "messages in/s > 0", lambda d: _number(_text(d, "rate-in")) > 0)
        _wait(browser, "4 connections", lambda d: _text(d, "connections") == "4")
        _wait(browser, "every client listed", lambda d: sorted(_row_ids(d)) == sorted([*ids, "dash-pub"]))
        assert _number(_text(browser, "bytes-in")) > 0

        # Client ids are text: the hostile one shows verbatim and injected no element.
        cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#clients tbody tr td:first-child")]
        assert hostile in cells
        assert browser.find_elements(By.CSS_SELECTOR, "#clients img") == []
        assert browser.title == "Tidewire"

        stats = httpx.get(f"{base}/api/v1/stats", headers={"Authorization": f"Bearer {node.api_token}"}).json()
        if stats.get("top_topics"):  # filled once the metrics collector counts topics
            _wait(browser, "top topic shown", lambda d: "dash/topic" in _text(d, "topics"))
        assert browser.find_elements(By.CSS_SELECTOR, "#nodes tbody tr[data-node-id]"), "no cluster member shown"
        assert "node " in _text(browser, "status")

        search = browser.find_element(By.ID, "client-search")
        search.send_keys("dash-b")
        _wait(browser, "search narrows to dash-b", lambda d: _row_ids(d) == ["dash-b"])

        browser.find_element(By.CSS_SELECTOR, '#clients tbody tr[data-client-id="dash-b"] button.kick').click()
        assert clients["dash-b"].wait_disconnect(timeout=5) == MQTT5_ADMINISTRATIVE_ACTION
        _wait(browser, "kicked row gone", lambda d: _row_ids(d) == [])
        _wait(browser, "3 connections", lambda d: _text(d, "connections") == "3")

        search.clear()
        search.send_keys("dash")  # everything but the kicked client is still there
        _wait(browser, "others still listed", lambda d: sorted(_row_ids(d)) == ["dash-a", "dash-pub"])

        # No script error in the console (the 401s of the token-less start are network entries, not errors of ours).
        errors = [e["message"] for e in browser.get_log("browser")
                  if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
        assert errors == []

        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot))
        if os.environ.get("TIDEWIRE_SAVE_SCREENSHOT"):
            shutil.copyfile(shot, SCREENSHOT_COPY)
