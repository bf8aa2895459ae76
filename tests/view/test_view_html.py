"""The viewer's HTML without a browser: data embedded and escaped, nothing external, errors that name the fix."""

import json
import re
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from view_fixtures import FILTERED, HOSTILE_OBSERVATION, HOSTILE_POLICY, mixed_tree

from tracerl.cli import main
from tracerl.report.view import make_server, script_json, write_view

DATA_BLOCK = re.compile(r'<script type="application/json" id="tracerl-data">(.*?)</script>', re.S)


def split_page(path):
    page = path.read_text(encoding="utf-8")
    match = DATA_BLOCK.search(page)
    assert match, "the page has no <script type=application/json id=tracerl-data> block"
    return page, match.group(1), page[: match.start()] + page[match.end():]


def test_model_text_is_only_in_the_json_block_and_cannot_close_it(run_dir):
    page, block, outside = split_page(write_view(run_dir))
    for text in ("<script>alert(1)</script>", "<script>window.__xss=1</script>", "<b>x</b>", "<img src=x",
                 "<!--", "window.__xss"):
        assert text not in outside, f"{text!r} appears in the page outside the JSON block"
    assert "<" not in block and ">" not in block, "the JSON block holds a raw < or >: model text could close it"
    assert page.count("<script") == 2 and page.count("</script>") == 2, "only the data block and the page script"
    turn = json.loads(block)["steps"][0]["trees"][0]["nodes"][1]
    assert (turn["pt"], turn["ot"]) == (HOSTILE_POLICY, HOSTILE_OBSERVATION), "escaping changed the text"


def test_script_json_round_trips_any_text():
    text = '</script><!--<script>\\</ \u2028 & "quote" \x00 <\\/script>'
    out = script_json({"t": text})
    assert "<" not in out and ">" not in out and "&" not in out
    assert json.loads(out)["t"] == text


def test_page_is_self_contained(run_dir):
    page, _, outside = split_page(write_view(run_dir))
    for marker in ("<script src", "<link", "@import", "url(", "fetch(", "XMLHttpRequest", "innerHTML", "src=\"http",
                   "href=\"http"):
        assert marker not in outside, f"the page uses {marker!r}: it must work offline and never parse data as HTML"


def test_embedded_step_matches_the_trees(run_dir):
    _, block, _ = split_page(write_view(run_dir))
    data = json.loads(block)
    assert [s["step"] for s in data["steps"]] == [2] and data["initial"] == 0
    step = data["steps"][0]
    assert (step["method"], step["domain"], step["num_nodes"], step["num_mixed"]) == ("trace", "multihop", 12, 1)
    assert [t["outcome"] for t in step["trees"]] == ["mixed", "success", "fail"]
    filtered = {q["prompt_id"]: q["p"] for q in step["pool"] if q["granted"] == 0}
    assert filtered == FILTERED, "the pool prompts stage 1 filtered out must be listed with their p"
    nodes = step["trees"][0]["nodes"]
    np.testing.assert_allclose([n["v"] for n in nodes], mixed_tree().backup().vhat)
    assert (nodes[0]["p"], nodes[0]["k"], nodes[1]["p"], nodes[1]["k"], nodes[1]["x"]) == (0.5, 2, 0.4, 2, "predictor")
    assert [n["r"] for n in nodes] == [None, None, 0.0, 0.0, 1.0, 0.0]
    assert [n["o"] for n in nodes][4:] == ["continuation", "continuation"]
    assert step["trees"][0]["num_continuations"] == 2 and step["num_anchors"] == 1


def test_all_steps_embeds_every_step_and_opens_on_the_requested_one(run_dir, tmp_path):
    path = write_view(run_dir, step=1, out=tmp_path / "all.html", all_steps=True)
    data = json.loads(split_page(path)[1])
    assert [s["step"] for s in data["steps"]] == [1, 2] and data["initial"] == 0


def test_missing_trees_and_steps_name_the_fix(run_dir, tmp_path):
    with pytest.raises(ValueError, match="run.save_trees=true"):
        write_view(tmp_path)
    with pytest.raises(ValueError, match=r"no trees for step 7; steps with trees: \[1, 2\]"):
        write_view(run_dir, step=7)
    with pytest.raises(ValueError, match="not a directory"):
        write_view(tmp_path / "nope")


def test_cli_view_writes_the_page(run_dir, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["view", str(run_dir), "--step", "1", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert json.loads(split_page(out)[1])["steps"][0]["step"] == 1
    assert main(["view", str(tmp_path / "empty-run-that-is-missing")]) == 2


def test_server_serves_only_the_page_on_loopback(run_dir):
    path = write_view(run_dir)
    server = make_server(path, port=0)
    host, port = server.server_address[:2]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            assert response.read() == path.read_bytes()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics.jsonl", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
