"""Run a real `equeue console` process and drive it with headless Chromium from Debian's packages.

Nothing downloads a browser or a driver: selenium is given /usr/bin/chromedriver explicitly (so
selenium-manager is skipped) and SE_MANAGER_PATH points at /bin/false, so any attempt to run it
would fail instead of fetching something.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.helpers.broker import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                  "--no-first-run", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--window-size=1280,1000")


class ConsoleProcess:
    def __init__(self, broker: str | None, log_dir: Path, sample_interval: float = 1.0,
                 nameserver: str | None = None) -> None:
        """`broker`: the console of that broker; `nameserver` (broker None): of a cluster."""
        self.broker = broker
        self.nameserver = nameserver
        self.port = free_port()
        self.sample_interval = sample_interval
        self.log_path = Path(log_dir) / f"console-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ConsoleProcess:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "equeue_core.cli.main", "console",
             *(["--nameserver", self.nameserver] if self.nameserver else ["--broker", str(self.broker)]),
             "--port", str(self.port), "--sample-interval", str(self.sample_interval)],
            stdout=subprocess.PIPE, stderr=self._log)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if b"equeue console on" in line:
                return self
        self.stop()
        raise RuntimeError(f"console did not start; log: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        self.proc = None


def chromium_driver(profile_dir: Path):
    """A headless Chromium webdriver on the system's browser and driver, with a fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            raise RuntimeError(f"{path} is missing: run `make system-deps` (Debian chromium, chromium-driver)")
    os.environ["SE_MANAGER_PATH"] = "/bin/false"  # never let selenium-manager fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile_dir}")
    service = Service(executable_path=CHROMEDRIVER, log_output=str(Path(profile_dir).parent / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    return driver


def save_screenshot(driver, tmp_dir: Path, name: str) -> Path:
    """Save a full-window PNG under tmp_dir, and copy it to $EQUEUE_ARTIFACTS when that is set."""
    path = Path(tmp_dir) / f"{name}.png"
    # The whole page, not just the window (Chromium's DevTools screenshot beyond the viewport).
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    path.write_bytes(base64.b64decode(shot["data"]))
    artifacts = os.environ.get("EQUEUE_ARTIFACTS")
    if artifacts:
        os.makedirs(artifacts, exist_ok=True)
        shutil.copy(path, Path(artifacts) / path.name)
    return path


def fresh_profile() -> Path:
    return Path(tempfile.mkdtemp(prefix="equeue-chromium-"))


@contextlib.contextmanager
def chromium_session() -> Iterator[Any]:
    """A headless Chromium webdriver with a profile of its own; quit, and the profile removed, at
    the end (a test module's `browser` fixture)."""
    profile = fresh_profile()
    driver = chromium_driver(profile)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: Any, timeout: float = 30.0) -> Any:
    """A WebDriverWait on `driver` polling every 0.2 s."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2)
