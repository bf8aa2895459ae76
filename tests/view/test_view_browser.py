"""The viewer in headless Chromium (the system chromium and chromedriver, driven by Selenium): it loads without
console errors, draws every tree and node, filters, switches steps, and shows a clicked node's turns as text."""

import pytest

from tracerl.bench.view import find_chromium, load_view, open_chromium
from tracerl.report.view import write_view

if find_chromium() is None:
    pytest.skip("no chromium binary on PATH: apt-get install chromium chromium-driver (Debian) to run the viewer's "
                "browser tests", allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402 (selenium is a dev dependency; chromium gates the module)
from selenium.webdriver.support.ui import Select  # noqa: E402
from view_fixtures import HOSTILE_OBSERVATION, HOSTILE_POLICY  # noqa: E402


@pytest.fixture(scope="module")
def driver():
    browser = open_chromium()
    yield browser
    browser.quit()


def severe_logs(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def visible_trees(driver) -> int:
    return len([c for c in driver.find_elements(By.CSS_SELECTOR, "#trees .tree") if c.is_displayed()])


def test_page_renders_every_tree_node_and_filtered_prompt(driver, run_dir):
    driver.get_log("browser")  # drop what earlier tests logged
    load_view(driver, write_view(run_dir))
    assert severe_logs(driver) == []
    assert len(driver.find_elements(By.CSS_SELECTOR, "#trees .tree")) == 3
    assert len(driver.find_elements(By.CSS_SELECTOR, "#trees .node")) == 12
    assert len(driver.find_elements(By.CSS_SELECTOR, "#trees .node.leaf")) == 8
    assert len(driver.find_elements(By.CSS_SELECTOR, "#trees .node.expanded")) == 1
    rows = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#filtered tr.filtered")]
    assert rows == ["skipped-a 0.020", "skipped-b 0.970"]
    assert "3 trees, 12 nodes, 1 mixed" in driver.find_element(By.ID, "summary").text


def test_click_shows_the_turn_as_text_and_runs_nothing(driver, run_dir, tmp_path):
    load_view(driver, write_view(run_dir))
    driver.find_element(By.CSS_SELECTOR, '#trees .tree[data-tree="0"] .node[data-i="1"]').click()
    current = driver.find_element(By.CSS_SELECTOR, "#panel .turn.current")
    assert current.find_element(By.CSS_SELECTOR, "pre.policy").text == HOSTILE_POLICY
    assert current.find_element(By.CSS_SELECTOR, "pre.observation").text == HOSTILE_OBSERVATION
    assert current.find_element(By.CSS_SELECTOR, "pre.policy").is_displayed()
    assert driver.execute_script("return typeof window.__xss") == "undefined", "model text was executed"
    markup = driver.find_elements(By.CSS_SELECTOR, "#panel script, #panel img, #panel b")
    assert markup == [], "model text became markup"
    prompt = driver.find_element(By.CSS_SELECTOR, "#panel pre.prompt").text
    assert prompt == "Who founded <b>x</b>?"
    assert severe_logs(driver) == []
    shot = tmp_path / "tracerl-view.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    print(f"viewer screenshot: {shot}")


def test_filters_and_step_selector(driver, run_dir, tmp_path):
    load_view(driver, write_view(run_dir, step=1, out=tmp_path / "all.html", all_steps=True))
    assert "step 1 " in driver.find_element(By.ID, "summary").text
    expected = {"all": 3, "mixed": 1, "success": 1, "fail": 1}
    for value, count in expected.items():
        Select(driver.find_element(By.ID, "f-outcome")).select_by_value(value)
        assert visible_trees(driver) == count, f"outcome filter {value!r}"
    Select(driver.find_element(By.ID, "f-outcome")).select_by_value("mixed")
    assert driver.find_element(By.CSS_SELECTOR, "#trees .tree:not([style*='none']) .pid").text == "mixed-q"
    Select(driver.find_element(By.ID, "f-outcome")).select_by_value("all")
    Select(driver.find_element(By.ID, "f-domain")).select_by_value("multihop")
    Select(driver.find_element(By.ID, "f-method")).select_by_value("trace")
    assert visible_trees(driver) == 3
    Select(driver.find_element(By.ID, "f-step")).select_by_value("1")  # index of step 2
    assert "step 2 " in driver.find_element(By.ID, "summary").text
    assert len(driver.find_elements(By.CSS_SELECTOR, "#trees .node")) == 12
    assert severe_logs(driver) == []
