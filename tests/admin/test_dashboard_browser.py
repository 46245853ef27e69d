"""The dashboard in a real headless Chromium (selenium) against a real node: without a token it says so; with
`/#token=...` it shows live rates and the connection count from real paho clients, renders client ids as text
(never markup), finds a client by search and kicks it (the paho client is disconnected, the row goes). Its rules
view shows a republish rule and a webhook rule (to an endpoint the test serves) with their counts rising as paho
publishes, statements and actions as text, disables one and deletes both through its buttons; its bridges view
(hidden without bridges) follows a bridge to a real Mosquitto: sent/acked, received/stored, and the lag and error
once the remote is gone."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.bridges.rules.webhook_server import WebhookServer
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
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

HOSTILE = "<img src=x onerror=alert(1)>"  # an alert() would also fail the test (an unexpected dialog)


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


def _api(gw: Gateway, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, f"http://127.0.0.1:{gw.admin_port}/api/v1{path}", json=body,
                         headers={"Authorization": f"Bearer {gw.api_token}"}, timeout=10)


def _table(driver: WebDriver, table: str, attr: str) -> dict[str, list[str]]:
    """Row key -> the text of each cell, read in one script (no row can be re-rendered halfway through)."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll(`#${arguments[0]} tbody tr[${arguments[1]}]`),"
        " (tr) => [tr.getAttribute(arguments[1]), Array.from(tr.cells, (td) => td.textContent)]);", table, attr)
    return {str(key): [str(c) for c in cells] for key, cells in rows}


def _rules(driver: WebDriver) -> dict[str, list[str]]:
    return _table(driver, "rules", "data-rule-name")


def _empty_row(driver: WebDriver, table: str) -> str:
    cells = driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody td.empty")
    return str(cells[0].text) if cells else ""


def _counts(row: list[str] | None) -> list[int] | None:
    """matched, sent, failed, dead-lettered of a rules row."""
    return None if row is None else [int(v) for v in row[4:8]]


def _no_script_errors(driver: WebDriver) -> None:
    errors = [e["message"] for e in driver.get_log("browser")
              if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    assert errors == []


def _confirm(driver: WebDriver, accept: bool) -> str:
    alert = WebDriverWait(driver, WAIT).until(expected_conditions.alert_is_present())
    said = str(alert.text)
    if accept:
        alert.accept()
    else:
        alert.dismiss()
    return said


@pytest.fixture
def hook() -> Iterator[WebhookServer]:
    server = WebhookServer()
    yield server
    server.close()


@pytest.mark.slow  # a browser, a node and clients (a bridge: a Mosquitto too): seconds
def test_dashboard_rules_counts_disable_and_delete(node: Gateway, browser: WebDriver, hook: WebhookServer,
                                                  mqtt: Callable[[str], PahoClient]) -> None:
    browser.get(f"http://127.0.0.1:{node.admin_port}/#token={node.api_token}")
    _wait(browser, "no rules yet", lambda d: _empty_row(d, "rules") == "no rules")
    assert not browser.find_element(By.ID, "bridges-section").is_displayed()  # a node without bridges

    # A rule name is 1 to 64 of A-Z a-z 0-9 _ . - (it names a group, a URL path, the dead-letter topic): the API
    # refuses markup there, so markup comes in through what a rule may hold: its statement, description, action.
    refused = _api(node, "PUT", "/rules/" + quote(HOSTILE, safe=""), {
        "name": HOSTILE, "sql": 'SELECT * FROM "dash/#"', "action": {"type": "republish", "topic": "x"}})
    assert refused.status_code == 422 and "rule name" in refused.text
    republish = {"name": "alerts", "description": HOSTILE,
                 "sql": 'SELECT payload.temp AS t, clientid FROM "dash/sensors/#" '
                        f"WHERE payload.temp > 30 AND clientid <> '{HOSTILE}'",
                 "action": {"type": "republish", "topic": f"dash/alerts/{HOSTILE}/${{clientid}}", "qos": 1}}
    webhook = {"name": "hook", "sql": 'SELECT payload.n AS n FROM "dash/sensors/#" WHERE payload.temp > 30',
               "action": {"type": "webhook", "url": hook.url}}
    for rule in (republish, webhook):
        made = _api(node, "PUT", f"/rules/{rule['name']}", rule)
        assert made.status_code == 200, made.text

    alerts = mqtt("dash-alerts")
    alerts.subscribe("dash/alerts/#", 1)
    device = mqtt("dash-dev")

    def publish(first: int, n: int) -> None:
        for i in range(first, first + n):
            device.publish("dash/sensors/r1", json.dumps({"n": i, "temp": 31}), qos=1)
        device.publish("dash/sensors/r1", json.dumps({"n": -1, "temp": 20}), qos=1)  # selected by neither

    publish(0, 3)
    _wait(browser, "3 matched and sent by each rule", lambda d: {k: _counts(v) for k, v in _rules(d).items()} == {
        "alerts": [3, 3, 0, 0], "hook": [3, 3, 0, 0]})
    publish(3, 2)
    _wait(browser, "counts up to 5", lambda d: {k: _counts(v) for k, v in _rules(d).items()} == {
        "alerts": [5, 5, 0, 0], "hook": [5, 5, 0, 0]})
    assert sorted(r["n"] for r in hook.delivered()) == [0, 1, 2, 3, 4]
    assert [(m.topic, json.loads(m.payload)["t"]) for m in alerts.expect(5)] == [
        (f"dash/alerts/{HOSTILE}/dash-dev", 31)] * 5
    listed = {r["name"]: r["counts"] for r in _api(node, "GET", "/rules").json()["data"]}
    assert listed == {name: {"matched": 5, "sent": 5, "failed": 0, "dead_lettered": 0} for name in ("alerts", "hook")}

    # What the API holds is text on the page: the statement, the action's target, the description (a tooltip).
    rows = _rules(browser)
    assert rows["alerts"][:4] == ["alerts", republish["sql"], f"republish → dash/alerts/{HOSTILE}/${{clientid}}",
                                  "running"]
    assert rows["hook"][:4] == ["hook", webhook["sql"], f"webhook → {hook.url}", "running"]
    name_cell = browser.find_element(By.CSS_SELECTOR, '#rules tr[data-rule-name="alerts"] td:first-child')
    assert name_cell.get_attribute("title") == f"alerts: {HOSTILE}"
    assert browser.find_elements(By.CSS_SELECTOR, "#rules img") == []
    assert HOSTILE in browser.find_element(By.ID, "rules").text  # shown, not only in the DOM

    browser.find_element(By.CSS_SELECTOR, '#rules tr[data-rule-name="hook"] button.rule-toggle').click()
    _wait(browser, "hook shown disabled", lambda d: _rules(d)["hook"][3] == "disabled"
          and d.find_element(By.CSS_SELECTOR, '#rules tr[data-rule-name="hook"] button.rule-toggle').text == "Enable")
    state = _api(node, "GET", "/rules/hook").json()
    assert (state["enabled"], state["running"]) == (False, False)
    assert _rules(browser)["alerts"][3] == "running"

    # Delete asks first: dismissed, nothing happens; accepted, the row and the rule go.
    delete = '#rules tr[data-rule-name="alerts"] button.rule-delete'
    browser.find_element(By.CSS_SELECTOR, delete).click()
    assert '"alerts"' in _confirm(browser, accept=False)
    assert _api(node, "GET", "/rules/alerts").status_code == 200
    assert "alerts" in _rules(browser)
    browser.find_element(By.CSS_SELECTOR, delete).click()
    _confirm(browser, accept=True)
    _wait(browser, "alerts row gone", lambda d: list(_rules(d)) == ["hook"])
    assert _api(node, "GET", "/rules/alerts").status_code == 404

    browser.find_element(By.CSS_SELECTOR, '#rules tr[data-rule-name="hook"] button.rule-delete').click()
    _confirm(browser, accept=True)
    _wait(browser, "no rules again", lambda d: _empty_row(d, "rules") == "no rules")
    assert _api(node, "GET", "/rules").json()["data"] == []
    assert browser.find_element(By.ID, "rules-message").text == ""
    _no_script_errors(browser)


@pytest.mark.slow  # a browser, a node and clients (a bridge: a Mosquitto too): seconds
def test_dashboard_bridges(browser: WebDriver, tmp_path: Path) -> None:
    with Gateway(tmp_path / "remote", target="mosquitto") as remote:
        conf = tmp_path / "bridges.conf"
        conf.write_text(f"connection b1\naddress 127.0.0.1:{remote.port}\nrestart_timeout 1\n"
                        "topic out/# out 1\ntopic in/# in 1\n")
        with Gateway(tmp_path / "local", target="tidewire", admin=True,
                     extra_args=["--mosquitto-bridge", str(conf)]) as local:
            local_client = PahoClient(local.port, "dash-local")
            remote_client = PahoClient(remote.port, "dash-remote", version=4)
            try:
                browser.get(f"http://127.0.0.1:{local.admin_port}/#token={local.api_token}")
                _wait(browser, "b1 connected", lambda d: _table(d, "bridges", "data-bridge-name").get(
                    "b1", [""] * 3)[1:3] == ["connected", f"127.0.0.1:{remote.port}"])
                assert browser.find_element(By.ID, "bridges-section").is_displayed()

                local_client.connect()
                remote_client.connect()
                for i in range(3):
                    local_client.publish("out/x", f"o{i}", qos=1)
                for i in range(2):
                    remote_client.publish("in/x", f"i{i}", qos=1)
                # sent, acked, received, stored, lag (messages), lag (s)
                _wait(browser, "3 sent and acked, 2 received and stored", lambda d: _table(
                    d, "bridges", "data-bridge-name")["b1"][3:9] == ["3", "3", "2", "2", "0", "0.0"])

                remote.stop()
                for i in range(3):
                    local_client.publish("out/x", f"late{i}", qos=1)
                _wait(browser, "the lag and the link's error shown", lambda d: (lambda row: row[1] != "connected"
                      and row[7] == "3" and row[9] != "")(_table(d, "bridges", "data-bridge-name")["b1"]))
                assert _empty_row(browser, "rules") == "no rules"
                _no_script_errors(browser)
            finally:
                local_client.close()
                remote_client.close()
