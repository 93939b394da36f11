"""A real headless Chromium driven by selenium, for the viewer's browser tests.

Debian's ``chromium`` and ``chromium-driver`` packages (CI installs them: .ci/run). Without
them the browser tests skip with the reason, except under CI, where a missing browser is a
failure: the page must be tested there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")
LOAD_TIMEOUT_S = 30


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must install chromium and chromium-driver (.ci/run)")
    pytest.skip(f"{reason} (apt-get install chromium chromium-driver)")


def find_chromium() -> tuple[str, str]:
    """(browser, driver) paths, or skip/fail as the module docstring says."""
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        _missing("no chromium and chromedriver on PATH")
    try:
        import selenium  # noqa: F401  (a dev dependency)
    except ImportError:
        _missing("selenium is not installed (pip install -e '.[dev]')")
    return browser, driver  # type: ignore[return-value]


@contextmanager
def chromium(profile: Path, downloads: Path | None = None) -> Iterator[Any]:
    """A selenium WebDriver on a fresh headless Chromium profile; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = find_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver path is given, so selenium never tries to download one.
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.set_page_load_timeout(LOAD_TIMEOUT_S)
        if downloads is not None:
            driver.execute_cdp_cmd("Page.setDownloadBehavior",
                                   {"behavior": "allow", "downloadPath": str(downloads)})
        yield driver
    finally:
        driver.quit()


def wait_ready(driver: Any, hash_part: str = "") -> None:
    """Until the page has drawn the view whose URL hash contains ``hash_part``."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, LOAD_TIMEOUT_S).until(lambda d: d.execute_script(
        "return document.body.dataset.ready !== undefined && "
        "document.body.dataset.ready === (location.hash || '#/sessions') && "
        "location.hash.includes(arguments[0])", hash_part))
