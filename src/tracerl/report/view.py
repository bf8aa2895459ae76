"""`tracerl view`: a training step's rollout trees as one self-contained HTML file.

For a step saved by `tracerl train` (`<run>/trees/step-NNNNNN.json.gz`, see `tracerl.io.files.runlog.write_trees`) the
page shows every prompt's tree (nodes coloured by backed-up success `Tree.backup().vhat`, leaves as squares, the
predictor's p at anchors, the nodes stage 2 expanded with their number of continuations, continuation edges dashed), the
pool prompts stage 1 filtered out (granted 0) with their predicted p, and on a click the text of every turn on the path
to the node (policy text and observation apart). Filters: outcome (mixed / all success / all fail), domain, method; a
step selector when several steps are embedded (`all_steps=True`).

The data goes into the page as JSON inside `<script type="application/json">`, with every `<`, `>` and `&` written as
a JSON unicode escape, so no model text can close the script element or form markup; the script builds the DOM with
`textContent` only. CSS and JavaScript are inlined (`tracerl.report.view_page`): the file opens from disk with no
network.

Deliberately not here: token ids and logprobs (text and token counts only), recomputing allocation or advantages,
and any server beyond `serve_file` (http.server on 127.0.0.1, this one file only).
"""

from __future__ import annotations

import html
import http.server
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.core.tree import Tree
from tracerl.io.files.runlog import TREES_DIR, read_trees
from tracerl.report.view_page import CSS, JS


def tree_steps(run_dir: str | Path) -> list[int]:
    """Steps of `run_dir` with saved trees, ascending (ValueError naming the fix when there are none)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} is not a directory; pass a run directory written by `tracerl train`")
    directory = run_dir / TREES_DIR
    steps = sorted(int(p.name[5:11]) for p in directory.glob("step-*.json.gz")) if directory.is_dir() else []
    if not steps:
        raise ValueError(f"{run_dir} has no saved trees ({directory} is empty or missing); train with "
                         "run.save_trees=true")
    return steps


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def _tree_payload(tree: Tree, domain: str) -> dict[str, Any]:
    backup = tree.backup()
    mixed = tree.mixed(backup)
    nodes = []
    for node in tree.nodes:
        seg = node.segment
        nodes.append({
            "pa": node.parent_id, "d": node.depth, "v": _num(float(backup.vhat[node.node_id])),
            "n": int(backup.num_leaves[node.node_id]), "m": bool(mixed[node.node_id]), "r": _num(node.reward),
            "f": node.finish_reason, "e": bool(node.tool_error), "o": node.origin, "a": node.anchor_id,
            "p": _num(node.p_pred), "x": node.expand_reason, "k": int(node.num_granted),
            "pt": seg.policy_text, "ot": seg.observation_text,
            "tp": seg.num_policy_tokens, "to": seg.num_tokens - seg.num_policy_tokens})
    rewards = tree.rewards()
    num_success = int((rewards > 0.5).sum())
    if mixed[0]:
        outcome = "mixed"
    elif not len(rewards):
        outcome = "empty"
    else:
        outcome = "success" if num_success == len(rewards) else "fail"
    anchors = [n for n in tree.nodes[1:] if n.num_granted > 0]
    return {"prompt_id": tree.prompt_id, "domain": str(tree.meta.get("domain") or domain), "outcome": outcome,
            "num_leaves": len(rewards), "num_success": num_success, "num_anchors": len(anchors),
            "num_continuations": sum(n.num_granted for n in anchors), "nodes": nodes}


def step_payload(record: dict[str, Any]) -> dict[str, Any]:
    """What the page needs of one `read_trees` record: per node backed-up success, mixedness, text and counts."""
    domain = str(record.get("domain") or "unknown")
    trees = [_tree_payload(Tree.from_dict(t), domain) for t in record.get("trees", [])]
    pool = [{"prompt_id": str(q["prompt_id"]), "p": _num(q.get("p")), "granted": int(q.get("granted", 0))}
            for q in record.get("pool", [])]
    has_p = any(q["p"] is not None for q in pool) or any(n["p"] is not None for t in trees for n in t["nodes"])
    return {"step": int(record.get("step", 0)), "method": str(record.get("method") or "unknown"), "domain": domain,
            "has_p": has_p, "pool": pool, "trees": trees,
            "num_granted_prompts": sum(q["granted"] > 0 for q in pool),
            "num_filtered": sum(q["granted"] == 0 for q in pool),
            "num_nodes": sum(len(t["nodes"]) for t in trees), "num_mixed": sum(t["outcome"] == "mixed" for t in trees),
            "num_anchors": sum(t["num_anchors"] for t in trees),
            "num_continuations": sum(t["num_continuations"] for t in trees)}


def script_json(data: Any) -> str:
    """JSON safe inside a `<script>` element: `<`, `>` and `&` (which only occur inside strings) become unicode
    escapes, so the text holds no `</script>`, `<!--` or markup whatever the model wrote."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render_html(steps: list[dict[str, Any]], title: str, initial: int = 0) -> str:
    """The page for `steps` (payloads of `step_payload`), showing `steps[initial]` first."""
    assert steps and 0 <= initial < len(steps), "render_html needs at least one step and a valid initial index"
    data = script_json({"steps": steps, "initial": initial})
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{CSS}</style>
</head>
<body>
<header class="top">
<h1>{html.escape(title)}</h1>
<div class="summary" id="summary"></div>
<div class="controls">
<label>step <select id="f-step"></select></label>
<label>outcome <select id="f-outcome"><option value="all">all</option><option value="mixed">mixed</option>
<option value="success">all success</option><option value="fail">all fail</option></select></label>
<label>domain <select id="f-domain"></select></label>
<label>method <select id="f-method"></select></label>
<span id="shown"></span>
</div>
<div class="legend"><span>backed-up success</span><span>0</span><span class="ramp"></span><span>1</span>
<span>&#9679; inner node &#9632; leaf (reward)</span><span>dashed edge: continuation</span>
<span>stage 2 expanded (+K continuations, p):</span>
<span><span class="swatch" style="border-color:#1f5fbf"></span> predictor</span>
<span><span class="swatch" style="border-color:#8a3ffc"></span> uniform</span>
<span><span class="swatch" style="border-color:#d97706"></span> random</span></div>
</header>
<main>
<div id="left"><div id="trees"></div><div id="pool"></div></div>
<aside id="panel"></aside>
</main>
<div id="tip"></div>
<script type="application/json" id="tracerl-data">{data}</script>
<script>{JS}</script>
</body>
</html>
"""


def write_view(run_dir: str | Path, step: int | None = None, out: str | Path | None = None, *,
               all_steps: bool = False) -> Path:
    """Write the viewer for `step` (default: the last step with trees) and return its path.

    `all_steps` embeds every saved step (the page opens on `step`). Default output:
    `<run>/view-step-NNNNNN.html`, or `<run>/view-all.html` with `all_steps`."""
    run_dir = Path(run_dir)
    steps = tree_steps(run_dir)
    step = steps[-1] if step is None else int(step)
    if step not in steps:
        raise ValueError(f"{run_dir} has no trees for step {step}; steps with trees: {steps}; pick one with --step")
    chosen = steps if all_steps else [step]
    payloads = [step_payload(read_trees(run_dir, s)) for s in chosen]
    title = f"tracerl trees: {run_dir.resolve().name}" + ("" if all_steps else f", step {step}")
    page = render_html(payloads, title, initial=chosen.index(step))
    if out is None:
        out = run_dir / ("view-all.html" if all_steps else f"view-step-{step:06d}.html")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def make_server(path: str | Path, port: int = 8765) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:`port` (0: any free port) that serves the one file `path` at `/` and at its name,
    and 404 for everything else (the rest of the run directory stays private)."""
    path = Path(path).resolve()
    body = path.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] not in ("/", "/" + path.name):
                self.send_error(404, "only the viewer page is served here")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)


def serve_file(path: str | Path, port: int = 8765, say: Callable[[str], None] = print) -> None:
    """Serve the one file `path` on http://127.0.0.1:`port`/ until interrupted (Ctrl-C)."""
    server = make_server(path, port)
    say(f"serving {Path(path).resolve()} on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
