"""Console fixtures: a real mesh with a delay scheduler, a txn-checker and the console process,
and one headless Chromium (selenium + /usr/bin/chromedriver) per test module.

Screenshots: `shoot(driver, name)` writes `<name>.png` under the pytest tmp dir
and, when FERRY_SCREENSHOT_DIR is set, there too (how docs/console/*.png were taken).
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.client.conftest import Mesh
from tests.delay_scheduler.conftest import SchedulerProc, start_scheduler
from tests.support.procs import Etcd, Proc, free_port, spawn, wait_until_ready
from tests.txn_checker.conftest import TxnCheckerProc, start_txn_checker

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1440, 1100)
READY_TIMEOUT_S = 30.0


@dataclass
class ConsoleMesh:
    """The mesh, its services and the console, as the browser tests see them."""

    mesh: Mesh
    scheduler: SchedulerProc
    checker: TxnCheckerProc
    console: Proc
    console_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.console_port}"


def start_console(mesh: Mesh, scheduler: str, checker: str, extra: dict[str, str] | None = None,
                  name: str = "console") -> tuple[Proc, int]:
    port = free_port()
    env = {"FERRY_CONSOLE_HTTP_PORT": str(port), "FERRY_CONSOLE_NAMESRV": mesh.namesrv,
           "FERRY_CONSOLE_DELAY_SCHEDULER": scheduler, "FERRY_CONSOLE_TXN_CHECKER": checker,
           "FERRY_CONSOLE_DEDUP": "", "FERRY_CONSOLE_RATE_INTERVAL_MS": "1000", **(extra or {})}
    proc = spawn(name, [sys.executable, "-m", "ferry_console"], mesh.workdir / name, env)
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", READY_TIMEOUT_S)
    return proc, port


# One for the package (test_guards and test_pages): each module uses topics and groups
# of its own, and starting it costs two brokers, a scheduler, a checker and the console.
@pytest.fixture(scope="package")
def console_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleMesh]:
    mesh = Mesh(etcd, tmp_path_factory.mktemp("console-mesh"))
    procs: list[Proc] = []
    try:
        mesh.start_namesrv()
        # Brokers write their spans (store, retry, ...) to %TRACE% through namesrv.
        mesh.broker_env = {"FERRY_BROKER_NAMESRV": mesh.namesrv}
        for name in ("broker-a", "broker-b"):
            mesh.start_broker(name)
        scheduler = start_scheduler(mesh, "delay-scheduler")
        procs.append(scheduler.proc)
        checker = start_txn_checker(mesh)
        procs.append(checker.proc)
        console, port = start_console(mesh, f"127.0.0.1:{scheduler.http_port}",
                                      f"127.0.0.1:{checker.http_port}")
        procs.append(console)
        yield ConsoleMesh(mesh, scheduler, checker, console, port)
    finally:
        for p in reversed(procs):
            p.stop()
        mesh.stop()


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("chromium and chromium-driver are not installed (make setup installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.set_page_load_timeout(60)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def shoot(driver: object, shots: Path, name: str) -> Path:
    """Save a screenshot of the page as `<name>.png` (and into FERRY_SCREENSHOT_DIR if set)."""
    path = shots / f"{name}.png"
    height = driver.execute_script(  # type: ignore[attr-defined]
        "return document.documentElement.scrollHeight")
    driver.set_window_size(WINDOW[0], max(WINDOW[1], min(int(height) + 40, 4000)))  # type: ignore[attr-defined]
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"  # type: ignore[attr-defined]
    driver.set_window_size(*WINDOW)  # type: ignore[attr-defined]
    extra = os.environ.get("FERRY_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / path.name)
    return path
