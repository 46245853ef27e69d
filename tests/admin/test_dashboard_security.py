"""The dashboard's security panel in a real headless Chromium against a node with dynamic security on: a role, an
ACL and a user made through its forms are in force for a real paho client at once; markup in a role name shows as
text; removing the ACL through its button revokes the client's subscription; deleting the user through its button
(confirmed) disconnects the client (0x98)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.admin.test_dashboard_browser import (  # noqa: F401 - `browser` is a fixture
    CHROMEDRIVER,
    CHROMIUM,
    HOSTILE,
    MQTT5_ADMINISTRATIVE_ACTION,
    _confirm,
    _no_script_errors,
    _table,
    _wait,
    browser,
)
from tests.integration.conftest import Gateway, PahoClient
from tests.integration.test_dynsec import DYNSEC_ENV

webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium 4")
from selenium.webdriver.chrome.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()), reason="needs chromium")


@pytest.fixture
def dynsec_node(tmp_path: Path) -> Iterator[Gateway]:
    with Gateway(tmp_path / "gw", admin=True, env=DYNSEC_ENV) as gw:
        yield gw


def _click(driver: WebDriver, selector: str) -> None:
    """Click what `selector` finds, looking again if the panel re-rendered it meanwhile."""
    def clicked(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, selector).click()
        return True

    _wait(driver, f"click {selector}", clicked)


def _fill(driver: WebDriver, values: dict[str, str]) -> None:
    for element_id, value in values.items():
        field = driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(value)


@pytest.mark.slow  # a browser, a node and a client: seconds
def test_dashboard_makes_a_role_and_user_in_force_at_once(dynsec_node: Gateway,
                                                          browser: WebDriver) -> None:  # noqa: F811 - the fixture
    node = dynsec_node
    browser.get(f"http://127.0.0.1:{node.admin_port}/#token={node.api_token}")
    _wait(browser, "security panel shown", lambda d: d.find_element(By.ID, "security-section").is_displayed())
    _wait(browser, "the bootstrap admin listed", lambda d: "admin" in _table(d, "dynsec-clients", "data-username"))

    _fill(browser, {"dynsec-rolename": "rooms"})
    browser.find_element(By.CSS_SELECTOR, "#dynsec-role-form button").click()
    _fill(browser, {"dynsec-rolename": HOSTILE})
    browser.find_element(By.CSS_SELECTOR, "#dynsec-role-form button").click()
    _wait(browser, "roles listed", lambda d: {"rooms", HOSTILE} <= set(_table(d, "dynsec-roles", "data-rolename")))
    assert browser.find_elements(By.CSS_SELECTOR, "#dynsec-roles img") == []  # text, never markup

    _fill(browser, {"dynsec-acl-role": "rooms", "dynsec-acl-topic": "room/%c"})
    Select(browser.find_element(By.ID, "dynsec-acl-type")).select_by_value("subscribeLiteral")
    browser.find_element(By.CSS_SELECTOR, "#dynsec-acl-form button").click()
    _wait(browser, "ACL shown", lambda d: "allow subscribeLiteral room/%c (0)"
          in _table(d, "dynsec-roles", "data-rolename").get("rooms", ["", ""])[1])

    _fill(browser, {"dynsec-username": "guest", "dynsec-password": "guest-pw", "dynsec-client-role": "rooms",
                    "dynsec-tenant": "acme"})
    browser.find_element(By.CSS_SELECTOR, "#dynsec-client-form button").click()
    _wait(browser, "user listed", lambda d: _table(d, "dynsec-clients", "data-username").get("guest", [])[:5]
          == ["guest", "", "rooms", "enabled", "acme"])
    assert browser.find_element(By.ID, "dynsec-password").get_attribute("value") == ""

    guest = PahoClient(node.port, "g1", username="guest", password="guest-pw")
    guest.connect()
    assert guest.subscribe([("room/g1", 1), ("room/other", 1)]) == [1, 0x87]

    # Remove the ACL through its button: the connected client's subscription goes.
    _click(browser, '#dynsec-roles tr[data-rolename="rooms"] .dynsec-acl button.dynsec-acl-remove')
    _wait(browser, "ACL gone", lambda d: _table(d, "dynsec-roles", "data-rolename").get("rooms", ["", "x"])[1] == "")
    assert guest.unsubscribe("room/g1") == [0x11]  # No subscription existed: it was revoked

    _click(browser, '#dynsec-clients tr[data-username="guest"] button')
    assert "guest" in _confirm(browser, accept=True)
    assert guest.wait_disconnect(timeout=5) == MQTT5_ADMINISTRATIVE_ACTION
    _wait(browser, "user gone", lambda d: "guest" not in _table(d, "dynsec-clients", "data-username"))
    _no_script_errors(browser)
    guest.close()
