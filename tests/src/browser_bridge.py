"""A real headless Chromium driven by Selenium through the Debian chromedriver.

Reads one JSON command per line on stdin, answers one JSON line on stdout:
{"ok": true, "value": ...} or {"ok": false, "error": "..."}. Nothing is
downloaded: the browser and the driver are the Debian packages chromium and
chromium-driver (Selenium Manager is kept offline).
"""

import json
import os
import sys
import time

os.environ.setdefault("SE_OFFLINE", "true")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def start():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("VACANCY_CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,800", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    service = Service(executable_path=os.environ.get("VACANCY_CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    # The page itself gets exactly 1280x800 (the window's frame not counted).
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    return driver


def first(driver, css):
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0] if found else None


def wait(driver, cmd):
    deadline = time.monotonic() + float(cmd.get("timeout", 20))
    want = cmd.get("text")
    last = None
    while True:
        el = first(driver, cmd["css"])
        if el is not None:
            try:
                last = el.text
                if want is None or want in last:
                    return last
            except Exception as e:  # re-rendered under us: look again
                last = f"(stale: {e.__class__.__name__})"
        if time.monotonic() > deadline:
            raise TimeoutError(f"{cmd['css']!r} with text {want!r} did not appear; last text: {last!r}")
        time.sleep(0.1)


def run(driver, cmd):
    # The console re-renders on every status change: an element found a moment
    # ago may be replaced before it is used, so look it up again.
    for attempt in range(10):
        try:
            return run_once(driver, cmd)
        except StaleElementReferenceException:
            if attempt == 9:
                raise
            time.sleep(0.05)


def run_once(driver, cmd):
    op = cmd["op"]
    if op == "get":
        driver.get(cmd["url"])
        return None
    if op == "wait":
        return wait(driver, cmd)
    if op == "text":
        el = first(driver, cmd["css"])
        return None if el is None else el.text
    if op == "count":
        return len(driver.find_elements(By.CSS_SELECTOR, cmd["css"]))
    if op == "click":
        el = first(driver, cmd["css"])
        if el is None:
            raise LookupError(f"nothing matches {cmd['css']!r}")
        el.click()
        return None
    if op == "type":
        el = first(driver, cmd["css"])
        if el is None:
            raise LookupError(f"nothing matches {cmd['css']!r}")
        if cmd.get("clear", True):
            el.clear()
        el.send_keys(cmd["text"])
        return None
    if op == "js":
        return driver.execute_script(cmd["script"])
    if op == "screenshot":
        driver.save_screenshot(cmd["path"])
        return cmd["path"]
    raise ValueError(f"unknown op {op!r}")


def main():
    driver = start()
    print(json.dumps({"ok": True, "value": driver.capabilities.get("browserVersion")}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            if cmd.get("op") == "quit":
                break
            try:
                reply = {"ok": True, "value": run(driver, cmd)}
            except Exception as e:
                reply = {"ok": False, "error": f"{e.__class__.__name__}: {e}"}
            print(json.dumps(reply), flush=True)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
