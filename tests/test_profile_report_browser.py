"""The profile report page in a real browser (headless Chromium).

Statistics of several tables (Zipf ids; a div table, a mod table with a
sequence feature of 0..20 ids per example, a wide table with cut counts, a
one-id one-shard table, a table without lookups) are saved, the page is
written by `python -m estimator_spec profile DIR` in a subprocess, and
Chromium opens it. On the screenshot, every plot's region holds drawn
marks (coloured pixels), not only a frame; each table has its four plots
(the table without lookups none, but its note); the browser reports no
console errors and requests nothing but the page itself.

Needs Debian's `chromium` and `chromium-driver` (`make browser` installs
them where it can); skipped where they are not found.
"""
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from estimator_spec.profiling import statistics as st
from estimator_spec.profiling import store
from tests import test_profile_report as reports

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = list(reports.KINDS)
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
          "--no-first-run", "--disable-background-networking",
          "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage", "--force-device-scale-factor=1",
          "--hide-scrollbars")


def _find(path, *names):
  if os.access(path, os.X_OK):
    return path
  for name in names:
    found = shutil.which(name)
    if found:
      return found
  return None


def _browser():
  chromium = _find("/usr/bin/chromium", "chromium", "chromium-browser")
  driver = _find("/usr/bin/chromedriver", "chromedriver")
  if not chromium or not driver:
    missing = " and ".join(name for name, path in (
        ("chromium", chromium), ("chromedriver", driver)) if not path)
    pytest.skip(f"{missing} not found: install Debian's chromium and "
                "chromium-driver (`make browser`) to run the browser test "
                "of the profile report.")
  return chromium, driver


def _statistics(directory):
  tables = [
      reports.observed(reports.settings("tbl_items", vocab=2000, shards=4),
                       reports.zipf_batches(10, 2000, count=8)),
      reports.observed(
          reports.settings("tbl_history", vocab=800, shards=3,
                           strategy="mod", features=(("history", 20),)),
          reports.zipf_batches(11, 800, max_length=20), rate=0.25),
      reports.observed(reports.settings("tbl_ads", vocab=10**6, shards=8),
                       reports.zipf_batches(12, 10**6, count=10, batch=1000,
                                            exponent=1.1), capacity=64),
      reports.observed(reports.settings("tbl_country", vocab=1, shards=1),
                       [(np.zeros(30, np.int64), np.ones(30, np.int64))]),
      st.TableStatistics(reports.settings("tbl_unused", vocab=10), 1.0),
  ]
  for stats in tables:
    store.save(str(directory), stats)
  return sorted(stats.settings["table"] for stats in tables)


def _profile(directory):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(
                 [REPO] + [p for p in os.environ.get("PYTHONPATH", "")
                           .split(os.pathsep) if p]))
  done = subprocess.run(
      [sys.executable, "-m", "estimator_spec", "profile", str(directory)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
      check=False)
  assert done.returncode == 0, done.stderr
  assert done.stderr == ""
  page = done.stdout.splitlines()[-1]
  assert page == str(directory / "report.html")
  return page


def _driver(chromium, driver_path, tmp_path):
  options = webdriver.ChromeOptions()
  options.binary_location = chromium
  for flag in _FLAGS:
    options.add_argument(flag)
  options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
  options.add_argument("--window-size=1100,900")
  options.set_capability("goog:loggingPrefs",
                         {"browser": "ALL", "performance": "ALL"})
  service = Service(driver_path,
                    log_output=str(tmp_path / "chromedriver.log"))
  return webdriver.Chrome(service=service, options=options)


def _requests_of(driver, document):
  """The URLs `document` requested (itself included), from the
  performance log (the browser's own pages are not the report's)."""
  urls = []
  for entry in driver.get_log("performance"):
    message = json.loads(entry["message"])["message"]
    params = message.get("params", {})
    if (message.get("method") == "Network.requestWillBeSent" and
        params.get("documentURL") == document):
      urls.append(params["request"]["url"])
  return urls


def _ink(image, rect):
  """(coloured pixels, non-white pixels) inside `rect` of the screenshot:
  plot marks are coloured, frames, ticks and text are grey."""
  box = (int(rect["x"]), int(rect["y"]), int(rect["x"] + rect["width"]),
         int(rect["y"] + rect["height"]))
  pixels = np.asarray(image.crop(box).convert("RGB"), np.int32)
  spread = pixels.max(axis=2) - pixels.min(axis=2)
  coloured = int(np.count_nonzero(spread > 60))
  inked = int(np.count_nonzero(pixels.min(axis=2) < 235))
  return coloured, inked


def test_report_page_renders_every_plot_in_chromium(tmp_path):
  chromium, driver_path = _browser()
  stats_dir = tmp_path / "profiles"
  stats_dir.mkdir()
  tables = _statistics(stats_dir)
  page = _profile(stats_dir)

  driver = _driver(chromium, driver_path, tmp_path)
  try:
    driver.get("file://" + page)
    height = driver.execute_script(
        "return document.documentElement.scrollHeight")
    chrome = driver.execute_script(
        "return window.outerHeight - window.innerHeight")
    driver.set_window_size(1100, height + chrome)
    assert driver.execute_script("return window.innerHeight") >= height
    screenshot = driver.get_screenshot_as_png()
    (tmp_path / "report.png").write_bytes(screenshot)
    image = Image.open(io.BytesIO(screenshot))
    assert image.size[1] >= height

    sections = driver.find_elements(By.CSS_SELECTOR, "section.table")
    assert [s.get_attribute("data-table") for s in sections] == tables
    plots_seen = 0
    for section in sections:
      name = section.get_attribute("data-table")
      plots = section.find_elements(By.CSS_SELECTOR, "svg.plot")
      if name == "tbl_unused":
        assert plots == []
        note = section.find_element(By.CSS_SELECTOR, "p.note")
        assert note.is_displayed() and "No lookups sampled" in note.text
        continue
      assert [p.get_attribute("data-plot") for p in plots] == KINDS
      for plot in plots:
        rect = plot.rect
        kind = plot.get_attribute("data-plot")
        assert rect["width"] >= 400 and rect["height"] >= 250, (name, kind)
        assert rect["y"] + rect["height"] <= image.size[1]
        coloured, inked = _ink(image, rect)
        # A single dot (one id) is about 80 coloured pixels; bars and lines
        # far more. Axes, ticks and labels alone are grey.
        assert coloured >= 60, (name, kind, coloured)
        assert inked >= 1500, (name, kind, inked)
        plots_seen += 1
    assert plots_seen == 4 * (len(tables) - 1)

    errors = [entry for entry in driver.get_log("browser")
              if entry["level"] == "SEVERE"]
    assert errors == []
    url = "file://" + page
    assert _requests_of(driver, url) == [url]
  finally:
    driver.quit()
