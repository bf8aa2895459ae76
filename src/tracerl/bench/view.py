"""`tracerl bench view`: how long the tree viewer takes to render a large step in headless Chromium.

Workload: a synthetic step (`synthetic_record`) of `num_prompts` grown trees from a pool twice that size (half
filtered out), each tree with 2-8 bare rollouts of 1-4 turns and stage-2 continuations from 0-2 prefixes, with turn
texts of a few hundred characters; about 15 nodes a tree (3,000 nodes for 200 prompts). It writes the page with
`tracerl.report.view.write_view`, loads it `repeats` times from disk in headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by Selenium) and reports the median of: the page's own `performance.now()` from script
start and from navigation start to the first render done (`document.body.dataset.rendered`), from navigation
start to the next frame (layout and paint done), and the wall clock from the load request to render done as seen by
the driver.

The browser helpers (`find_chromium`, `open_chromium`, `load_view`) are shared with the viewer's browser tests.
Deliberately not here: a browser download (the system chromium only), interaction timings beyond the first render.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.core.tree import Segment, Tree
from tracerl.io.files.runlog import write_trees

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WORDS = ("search", "the", "capital", "of", "company", "founded", "by", "born", "in", "city", "river", "who", "what",
         "<b>x</b>", "&amp;", "</script>", "answer", "document", "population", "year")


@dataclass(frozen=True)
class ViewBenchConfig:
    num_prompts: int = 200  # grown trees in the step (the pool holds twice as many; the rest are filtered out)
    repeats: int = 3  # page loads; the median counts
    policy_chars: int = 160  # about this many characters of policy text per turn
    observation_chars: int = 320  # about this many characters of observation per turn
    seed: int = 0


def _text(rng: np.random.Generator, chars: int) -> str:
    words, size = [], 0
    while size < chars:
        words.append(WORDS[int(rng.integers(len(WORDS)))])
        size += len(words[-1]) + 1
    return " ".join(words)


def _rollout(tree: Tree, start: int, rng: np.random.Generator, p_success: float, cfg: ViewBenchConfig,
             origin: str) -> None:
    """Turns from node `start` until a leaf (1-4 turns in all), the first one anchored at `start`."""
    node, turns = start, int(rng.integers(1, 5)) - tree.nodes[start].depth
    for t in range(max(turns, 1)):
        last = t == max(turns, 1) - 1
        seg = Segment.text_only(_text(rng, cfg.policy_chars), "" if last else _text(rng, cfg.observation_chars),
                                num_policy_tokens=40, num_observation_tokens=0 if last else 80)
        node = tree.add_child(node, seg, origin=origin, anchor_id=start if t == 0 else None,
                              reward=float(rng.random() < p_success) if last else None,
                              tool_error=bool(rng.random() < 0.05))


def synthetic_record(cfg: ViewBenchConfig = ViewBenchConfig()) -> dict[str, Any]:
    """A `write_trees` record of `cfg.num_prompts` trees (see the module docstring), method trace, domain multihop."""
    rng = np.random.default_rng(cfg.seed)
    pool, trees = [], []
    for i in range(2 * cfg.num_prompts):
        p = float(rng.beta(1.2, 1.2))
        granted = int(rng.integers(2, 9)) if i % 2 == 0 else 0
        pool.append({"prompt_id": f"q{i:04d}", "p": p, "granted": granted})
        if not granted:
            continue
        tree = Tree.new(f"q{i:04d}", _text(rng, 200), meta={"domain": "multihop"})
        tree.root.p_pred, tree.root.expand_reason, tree.root.num_granted = p, "root", granted
        for _ in range(granted):
            _rollout(tree, 0, rng, p, cfg, "bare")
        inner = [n.node_id for n in tree.nodes[1:] if not n.is_leaf]
        for node_id in rng.permutation(inner)[: int(rng.integers(0, 3))].tolist():
            k = int(rng.integers(1, 4))
            node = tree.nodes[node_id]
            node.p_pred, node.expand_reason, node.num_granted = float(rng.random()), "predictor", k
            for _ in range(k):
                _rollout(tree, node_id, rng, p, cfg, "continuation")
        trees.append(tree.to_dict())
    return {"step": 1, "method": "trace", "domain": "multihop", "pool": pool, "trees": trees}


def find_chromium() -> str | None:
    """Path of the system Chromium (or Chrome) binary, or None."""
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    return None


def open_chromium(width: int = 1400, height: int = 1000):
    """A headless Selenium driver over the system chromium and chromedriver (no download), browser logs on."""
    binary = find_chromium()
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        raise RuntimeError("headless Chromium needs the chromium and chromedriver binaries: "
                           "apt-get install chromium chromium-driver (Debian)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as err:
        raise RuntimeError(f"the viewer's browser checks need selenium: pip install -e '.[dev]' ({err})") from None
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-extensions", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=driver_path))


def load_view(driver, path: str | Path, timeout_s: float = 60.0) -> dict[str, float]:
    """Open `path` and wait for the first render; the page's and the driver's timings in ms."""
    from selenium.webdriver.support.ui import WebDriverWait

    t0 = time.perf_counter()
    driver.get(Path(path).resolve().as_uri())
    WebDriverWait(driver, timeout_s, poll_frequency=0.01).until(
        lambda d: d.execute_script("return document.body && document.body.dataset.rendered === '1'"))
    wall_ms = (time.perf_counter() - t0) * 1000
    WebDriverWait(driver, timeout_s, poll_frequency=0.01).until(
        lambda d: d.execute_script("return document.body.dataset.paintedAt !== undefined"))
    data = driver.execute_script("var b = document.body.dataset; return [b.renderMs, b.renderedAt, b.paintedAt]")
    return {"script_ms": float(data[0]), "navigation_ms": float(data[1]), "painted_ms": float(data[2]),
            "wall_ms": wall_ms}


def run(cfg: ViewBenchConfig = ViewBenchConfig()) -> dict[str, Any]:
    from tracerl.report.view import write_view

    record = synthetic_record(cfg)
    with tempfile.TemporaryDirectory(prefix="tracerl-bench-view-") as tmp:
        write_trees(tmp, record["step"], record)
        t0 = time.perf_counter()
        path = write_view(tmp, out=Path(tmp) / "view.html")
        write_ms = (time.perf_counter() - t0) * 1000
        html_bytes = path.stat().st_size
        driver = open_chromium()
        try:
            loads = [load_view(driver, path) for _ in range(cfg.repeats)]
            num_nodes_drawn = driver.execute_script("return document.querySelectorAll('#trees .node').length")
            browser = driver.capabilities.get("browserVersion", "?")
        finally:
            driver.quit()
    return {"config": asdict(cfg), "num_trees": len(record["trees"]), "num_pool": len(record["pool"]),
            "num_nodes": sum(len(t["nodes"]) for t in record["trees"]), "num_nodes_drawn": int(num_nodes_drawn),
            "html_bytes": html_bytes, "write_ms": write_ms, "browser": f"chromium {browser}",
            **{key: statistics.median(load[key] for load in loads)
               for key in ("script_ms", "navigation_ms", "painted_ms", "wall_ms")}}


def to_markdown(result: dict[str, Any]) -> str:
    head = ("| trees | pool | nodes | HTML | write (Python) | script start -> rendered | navigation -> rendered "
            "| navigation -> painted | load wall clock | browser |\n|---|---|---|---|---|---|---|---|---|---|")
    row = (f"| {result['num_trees']} | {result['num_pool']} | {result['num_nodes']:,} | "
           f"{result['html_bytes'] / 1e6:.2f} MB | {result['write_ms']:.0f} ms | {result['script_ms']:.0f} ms | "
           f"{result['navigation_ms']:.0f} ms | {result['painted_ms']:.0f} ms | {result['wall_ms']:.0f} ms | "
           f"{result['browser']} |")
    return head + "\n" + row
