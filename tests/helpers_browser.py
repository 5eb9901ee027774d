"""What the web page's browser tests share: whether headless Chromium can run here (CI sets
RILL_BROWSER_TESTS=required, which makes a missing browser an error instead of a skip), `rill serve`
in a subprocess on a free port, and a headless Chromium driven by Selenium."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

BROWSER_TOOLS = (("chromium", "chromium"), ("chromedriver", "chromium-driver"))
BASE_FLAGS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1100,760")


def browser_requirements(*extra_tools: tuple[str, str]) -> tuple[str | None, pytest.MarkDecorator]:
    """(what is missing or None, a skipif mark for the module). Selenium, Chromium and chromedriver missing
    under RILL_BROWSER_TESTS=required is an error; an extra tool (command, Debian package) missing is a skip."""
    missing = None
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing = "selenium is not installed (pip install -e '.[web]')"
    for tool, package in (*BROWSER_TOOLS, *extra_tools):
        if missing is None and shutil.which(tool) is None:
            missing = f"{tool} is not installed (Debian: apt-get install {package})"
            if (tool, package) in extra_tools:
                return missing, pytest.mark.skipif(True, reason=missing)
    if missing is not None and os.environ.get("RILL_BROWSER_TESTS") == "required":
        raise RuntimeError(f"RILL_BROWSER_TESTS=required but {missing}")
    return missing, pytest.mark.skipif(missing is not None, reason=missing or "")


@contextmanager
def rill_serve(tmp_path: Path, *flags: str, timeout_s: float = 120):
    """`rill serve --port 0 FLAGS` with one torch thread: yields its URL once it listens; SIGINT at the end,
    then kill if it lingers."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    log_path = tmp_path / f"serve-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "rill", "serve", "--port", "0", *flags],
                                   stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + timeout_s
        while not (match := re.search(r"serving .* at (http://127\.0\.0\.1:\d+)", log_path.read_text())):
            assert process.poll() is None, log_path.read_text()[-2000:]
            if time.monotonic() > deadline:
                raise TimeoutError(f"rill serve did not listen within {timeout_s} s: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield match[1]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def chromium(*flags: str):
    """Headless Chromium (BASE_FLAGS, then `flags`) whose console log the test can read."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (*BASE_FLAGS, *flags):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
