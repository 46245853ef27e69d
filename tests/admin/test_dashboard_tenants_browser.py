"""The dashboard's tenants panel in a real headless Chromium against a real node: hidden while the node has no
tenant; once paho clients of two tenants (named by a JWT claim) connect, it lists both with their mount points and
connection counts, and a refused connection shows in its tenant's row only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.admin.test_api_tenants import SECRET, tenant_client
from tests.admin.test_dashboard_browser import _no_script_errors, _table, _wait, browser  # noqa: F401 (a fixture)
from tests.integration.conftest import Gateway

pytestmark = pytest.mark.slow  # a browser and a node: several seconds

webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium 4")
from selenium.webdriver.chrome.webdriver import WebDriver  # noqa: E402


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Gateway]:
    env = {"TIDEWIRE_JWT_SECRET": SECRET, "TIDEWIRE_TENANT_JWT_CLAIM": "tenant",
           "TIDEWIRE_TENANTS": json.dumps({"acme": {"max_connections": 1, "max_retained_bytes": 1000}})}
    with Gateway(tmp_path / "gw", admin=True, env=env) as gw:
        yield gw


def _section_hidden(driver: WebDriver) -> bool:
    return bool(driver.execute_script("return document.getElementById('tenants-section').hidden"))


def test_dashboard_tenants_panel(node: Gateway, browser: WebDriver) -> None:  # noqa: F811 (the fixture)
    base = f"http://127.0.0.1:{node.admin_port}"
    clients = [tenant_client(node, "a1", "acme"), tenant_client(node, "g1", "globex"),
               tenant_client(node, "a2", "acme")]
    try:
        browser.get(f"{base}/#token={node.api_token}")
        _wait(browser, "the other panels load", lambda d: d.find_element("id", "auth-message").text == "")
        # `acme` is configured: the panel shows it even before any client; globex appears with its first one.
        _wait(browser, "acme listed", lambda d: "acme" in _table(d, "tenants", "data-tenant"))
        assert not _section_hidden(browser)
        clients[0].connect()
        clients[1].connect()
        assert clients[2].connect(check=False).reason_code == 0x97  # acme's one connection is taken
        _wait(browser, "both tenants with their counts", lambda d: {
            name: row[:3] for name, row in _table(d, "tenants", "data-tenant").items()} == {
            "acme": ["acme", "$tenant/acme/", "1 / 1"], "globex": ["globex", "$tenant/globex/", "1 / ∞"]})
        rows = _table(browser, "tenants", "data-tenant")
        assert rows["acme"][6:] == ["0 / 1000", "quota 1"] and rows["globex"][6:] == ["-", "0"]
        _no_script_errors(browser)
    finally:
        for c in clients:
            c.close()


def test_dashboard_tenants_panel_hidden_without_tenants(tmp_path: Path, browser: WebDriver) -> None:  # noqa: F811
    with Gateway(tmp_path / "plain", admin=True) as gw:
        browser.get(f"http://127.0.0.1:{gw.admin_port}/#token={gw.api_token}")
        _wait(browser, "the page loads", lambda d: d.find_element("id", "auth-message").text == "")
        _wait(browser, "the tenants panel answered", lambda d: d.find_element(
            "id", "tenants-section").get_attribute("data-answered") == "1")
        assert _section_hidden(browser)
        _no_script_errors(browser)
