"""Hand-built run directories for the viewer and report tests: two steps of saved trees, metrics and a config.

Step 2 (the last) holds three trees and a pool of five prompts, two of them filtered out by stage 1:

- `mixed-q`: root (p 0.5, m 2) -> turn 1 (bare) -> leaf r=0, and root -> leaf r=0 (bare); stage 2 expanded
  turn 1 (predictor, p 0.4, K 2) -> two continuation leaves r=1 and r=0. Turn 1's policy text holds a script
  and markup (`HOSTILE_POLICY`), its observation `HOSTILE_OBSERVATION`.
- `easy-q`: root (p 0.9, m 2) -> two leaves r=1.
- `hard-q`: root (p 0.1, m 2) -> two leaves r=0.
"""

from __future__ import annotations

import json

from tracerl.core.tree import Segment, Tree
from tracerl.io.files.runlog import RunLog, write_trees

HOSTILE_POLICY = "think <script>window.__xss=1</script> then <b>x</b> and <script>alert(1)</script>"
HOSTILE_OBSERVATION = '<img src=x onerror="window.__xss=2"> </script><!-- <b>x</b> & done'
FILTERED = {"skipped-a": 0.02, "skipped-b": 0.97}
CONTINUATION_COST = 0.5


def mixed_tree(with_p: bool = True) -> Tree:
    tree = Tree.new("mixed-q", "Who founded <b>x</b>?", meta={"domain": "multihop"})
    turn = tree.add_child(0, Segment.text_only(HOSTILE_POLICY, HOSTILE_OBSERVATION, 3, 4))
    tree.add_child(turn, Segment.text_only("<answer>no</answer>", "", 2, 0), reward=0.0)
    tree.add_child(0, Segment.text_only("<answer>no</answer>", "", 2, 0), reward=0.0)
    tree.add_child(turn, Segment.text_only("<answer>yes</answer>", "", 2, 0), reward=1.0, origin="continuation",
                   anchor_id=turn)
    tree.add_child(turn, Segment.text_only("<answer>no</answer>", "", 2, 0), reward=0.0, origin="continuation",
                   anchor_id=turn)
    tree.root.p_pred, tree.root.expand_reason, tree.root.num_granted = (0.5 if with_p else None), "root", 2
    node = tree.nodes[turn]
    node.p_pred, node.expand_reason, node.num_granted = (0.4 if with_p else None), "predictor", 2
    return tree


def star_tree(prompt_id: str, rewards: list[float], p: float | None) -> Tree:
    tree = Tree.new(prompt_id, f"question {prompt_id}", meta={"domain": "multihop"})
    for r in rewards:
        tree.add_child(0, Segment.text_only("<answer>a</answer>", "", 2, 0), reward=r)
    tree.root.p_pred, tree.root.expand_reason, tree.root.num_granted = p, "root", len(rewards)
    return tree


def step_record(step: int, method: str = "trace", with_p: bool = True) -> dict:
    trees = [mixed_tree(with_p), star_tree("easy-q", [1.0, 1.0], 0.9 if with_p else None),
             star_tree("hard-q", [0.0, 0.0], 0.1 if with_p else None)]
    pool = [{"prompt_id": t.prompt_id, "p": t.root.p_pred, "granted": t.root.num_granted} for t in trees]
    pool += [{"prompt_id": pid, "p": p if with_p else None, "granted": 0} for pid, p in FILTERED.items()]
    return {"step": step, "method": method, "domain": "multihop", "pool": pool,
            "trees": [t.to_dict() for t in trees]}


def make_run(path, method: str = "trace", with_p: bool = True):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"method": method, "data": {"domain": "multihop"},
                                                  "allocation": {"continuation_cost": CONTINUATION_COST}}))
    log = RunLog(path)
    log.write("eval", 0, {"eval/success": 0.25, "eval/success_se": 0.05, "rollout/cum_units": 0})
    for step in (1, 2):
        write_trees(path, step, step_record(step, method, with_p))
        log.write("train", step, {"rollout/success_rate": 0.3 + 0.1 * step, "alloc/effective_ratio": 1 / 3,
                                  "rollout/units": 7.0, "alloc/units_root": 6.0,
                                  "alloc/units_prefix": 2 * CONTINUATION_COST, "alloc/num_continuations": 2})
    log.write("eval", 2, {"eval/success": 0.375, "eval/success_se": 0.06, "rollout/cum_units": 14})
    return path
