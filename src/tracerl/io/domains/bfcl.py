"""BFCL v4 multi-turn cases as environments: the case's own stateful APIs, checked by BFCL's own checkers.

Install (bfcl-eval pins LLM clients, sentence-transformers and more; the multi-turn APIs, their data and the
checker need only the package itself and mpmath, for MathAPI; tested with 2026.3.23):

    pip install --no-deps "bfcl-eval==2026.3.23" "mpmath>=1.3"

Without it, importing this module still works (the io layer imports every module); `BfclDomain()` and
`BfclEnv()` raise ImportError with that line.

What it does, per case of a category ("multi_turn_base" by default; "multi_turn_miss_param" and
"multi_turn_long_context" work the same way):

- Data: the case file `BFCL_v4_<category>.json` and its `possible_answer/` twin that bfcl-eval ships (JSON lines,
  read directly: `bfcl_eval.utils.load_file` does the same but takes a lock file beside site-packages and needs
  `filelock`). Tools: the function docs BFCL ships for each involved class (`multi_turn_func_doc/`), with BFCL's
  type names mapped to JSON schema ("dict" -> "object", "float" -> "number", "tuple" -> "array").
- Rows: `prompt` holds the first user turn; `extra_info.user_turns` all of them. The ground truth is
  `{"case_id", "turns": [[{"name", "arguments"}, ...] per user turn]}`: BFCL's call strings parsed with `ast`
  (literals only, never `eval`), positional arguments named through the method's signature.
- Several user turns: the model ends a user turn with `<answer>...</answer>`; the env then checks that turn and,
  if more remain, returns the next user message as the observation (`info["role"] == "user"`, the rollout driver
  should insert it as a user message, not a tool message). The last `<answer>` ends the episode.
- API state: instances of the case's classes (GorillaFileSystem, TwitterAPI, ...) built as bfcl-eval does
  (`_load_scenario` on a deep copy of `initial_config`) and kept in `self.state`, so snapshot/restore resumes them.
  Tool calls run as methods on them; results are turned into text as BFCL does (dicts as JSON), and an exception
  becomes an error observation (`tool_error=True`). BFCL APIs mostly report misuse as a returned {"error": ...};
  that comes back as BFCL would show it, not flagged as a tool error.
- Reward, BFCL's multi-turn rule with its own `state_checker` and `response_checker`
  (`bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker`): at the end of each user turn whose ground truth
  is not empty, the model must have made at least one tool call in the turn (any well-formed one, as BFCL counts
  every decoded call), every API instance must equal (public
  attributes) the instance reached by running the ground-truth calls of all turns so far on fresh instances, and
  the ground-truth results of the turn must all be among the results of the model's calls so far (unordered,
  with multiplicity). Reward 1.0 iff every turn passes. A failed turn ends the episode at once with reward 0
  (no later turn can undo it). Ground-truth states are computed once per case and cached.
  The scripted expert (ground-truth replay) scores 199/200 in each category: case 173 passes
  `close_ticket(ticket_id="ticket_001")` while the doc BFCL ships declares ticket_id an integer, and the env keeps
  the documented schema (a wrong type is a tool error, as in every other domain).

Does not: run "multi_turn_miss_func" (functions revealed mid-case) or the memory / web-search categories, cap the
calls per turn (the rollout driver's turn limit does), grade the text of an answer, or call `eval` on anything.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib
import inspect
import json
import types
from typing import Any, Callable, Sequence

import numpy as np

from tracerl.io.domains.base import Domain, ToolEnv, make_row
from tracerl.io.domains.funcall import format_tool_call
from tracerl.io.env import StepResult
from tracerl.io.env.actions import Tool, parse_action
from tracerl.io.files import read_utf8

INSTALL_LINE = 'pip install --no-deps "bfcl-eval==2026.3.23" "mpmath>=1.3"'
CATEGORIES = ("multi_turn_base", "multi_turn_miss_param", "multi_turn_long_context")
SYSTEM_PROMPT = ("You are an assistant with tools. Complete each user request by calling tools, one call per "
                 "turn. When the request is done, reply <answer>a short summary</answer>; the user may then send "
                 "another request.")
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


@functools.cache
def require_bfcl() -> types.SimpleNamespace:
    """The parts of bfcl-eval this module uses; ImportError with the install line if they are missing."""
    try:
        import mpmath  # noqa: F401  (MathAPI imports it; fail here, not mid-episode)
        from bfcl_eval.constants.category_mapping import VERSION_PREFIX
        from bfcl_eval.constants.eval_config import MULTI_TURN_FUNC_DOC_PATH, POSSIBLE_ANSWER_PATH, PROMPT_PATH
        from bfcl_eval.constants.executable_backend_config import (
            CLASS_FILE_PATH_MAPPING, MULTI_TURN_FUNC_DOC_FILE_MAPPING, STATELESS_CLASSES)
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker
    except ImportError as err:
        raise ImportError(f"the BFCL domain needs bfcl-eval and mpmath; install them with: {INSTALL_LINE} "
                          f"({err})") from err
    if not (PROMPT_PATH / f"{VERSION_PREFIX}_multi_turn_base.json").exists():
        raise ImportError(f"bfcl-eval is installed but its data is missing under {PROMPT_PATH}; "
                          f"reinstall with: {INSTALL_LINE}")
    return types.SimpleNamespace(
        version_prefix=VERSION_PREFIX, prompt_path=PROMPT_PATH, answer_path=POSSIBLE_ANSWER_PATH,
        doc_path=MULTI_TURN_FUNC_DOC_PATH, doc_files=MULTI_TURN_FUNC_DOC_FILE_MAPPING,
        class_modules=CLASS_FILE_PATH_MAPPING, stateless=set(STATELESS_CLASSES),
        state_checker=state_checker, response_checker=response_checker)


def _read_jsonl(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in read_utf8(path).splitlines() if line.strip()]


def load_cases(category: str = "multi_turn_base") -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(case, possible answer) pairs of a category, in file order."""
    if category not in CATEGORIES:
        raise ValueError(f"category={category!r}; supported: {list(CATEGORIES)}")
    bfcl = require_bfcl()
    name = f"{bfcl.version_prefix}_{category}.json"
    cases, answers = _read_jsonl(bfcl.prompt_path / name), _read_jsonl(bfcl.answer_path / name)
    by_id = {a["id"]: a for a in answers}
    missing = [c["id"] for c in cases if c["id"] not in by_id]
    assert not missing, f"bfcl-eval ships no possible answer for {missing[:3]} in {name}"
    return [(c, by_id[c["id"]]) for c in cases]


@functools.cache
def api_class(class_name: str) -> type:
    module = importlib.import_module(require_bfcl().class_modules[class_name])
    return getattr(module, class_name)


@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    bfcl = require_bfcl()
    return tuple(_read_jsonl(bfcl.doc_path / bfcl.doc_files[class_name]))


def _json_schema(node: Any) -> Any:
    """BFCL's parameter docs with its type names mapped to JSON schema's."""
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k != "type"}
    if isinstance(node.get("type"), str) and _TYPES.get(node["type"], node["type"]) is not None:
        out["type"] = _TYPES.get(node["type"], node["type"])
    return out


def function_owners(involved_classes: Sequence[str]) -> dict[str, str]:
    """Documented function name -> the class that implements it (later classes win, as in bfcl-eval)."""
    return {doc["name"]: c for c in involved_classes for doc in function_docs(c)}


def parse_call(text: str, owners: dict[str, str]) -> dict[str, Any]:
    """BFCL's `name(arg, key=value)` string -> {"name", "arguments"} with every argument named."""
    node = ast.parse(text.strip(), mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), f"not a plain call: {text!r}"
    name = node.func.id
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    method = getattr(api_class(owners[name]), name)
    bound = inspect.signature(method).bind(None, *args, **kwargs).arguments
    return {"name": name, "arguments": {k: v for k, v in bound.items() if k != "self"}}


def make_instances(involved_classes: Sequence[str], initial_config: dict[str, Any],
                   long_context: bool = False) -> dict[str, Any]:
    """Fresh API instances, loaded as bfcl-eval's `execute_multi_turn_func_call` loads them."""
    instances = {}
    for class_name in involved_classes:
        instance = api_class(class_name)()
        if class_name not in require_bfcl().stateless:
            instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=long_context)
        instances[class_name] = instance
    return instances


def execute(instance: Any, name: str, arguments: dict[str, Any]) -> tuple[str, Exception | None]:
    """Run one call; (result as BFCL writes it, the exception if it raised)."""
    try:
        result = getattr(instance, name)(**arguments)
    except Exception as err:  # a tool failing on model-chosen arguments is data
        return f"Error during execution: {err}", err
    if isinstance(result, str):
        return result, None
    if isinstance(result, dict):
        try:
            return json.dumps(result), None
        except (TypeError, ValueError):
            return str(result), None
    return str(result), None


def split_of(case_id: str, test_fraction: float) -> str:
    bucket = int(hashlib.sha256(case_id.encode()).hexdigest()[:8], 16) / 16 ** 8
    return "test" if bucket < test_fraction else "train"


class BfclEnv(ToolEnv):
    """One BFCL case. state = {"instances", "results" (all call results so far, BFCL text), "user_turn",
    "num_calls_in_turn"}; the ground-truth states per turn live outside it (they never change)."""

    def __init__(self, expected_cache: dict[Any, Any] | None = None) -> None:
        super().__init__()
        self._bfcl = require_bfcl()
        self._expected_cache = {} if expected_cache is None else expected_cache
        self._tools: dict[str, Tool] = {}
        self._expected: list[tuple[dict[str, Any], list[str]]] = []

    # -- ToolEnv hooks
    def initial_state(self, row: dict[str, Any]) -> dict[str, Any]:
        # the tools and the expected states depend only on the row, so they are set here, outside self.state
        extra = row["extra_info"]
        owners = function_owners(extra["involved_classes"])
        self._tools = {doc["name"]: Tool(doc["name"], doc["description"], _json_schema(doc["parameters"]),
                                         fn=self._runner(owners[doc["name"]], doc["name"]))
                       for c in extra["involved_classes"] for doc in function_docs(c)}
        self._expected = self._expected_turns(row)
        return {"instances": self._fresh_instances(row), "results": [], "user_turn": 0, "num_calls_in_turn": 0}

    def tool_table(self) -> dict[str, Tool]:
        return self._tools

    def step(self, action: str) -> StepResult:
        parsed = parse_action(action)
        if parsed.kind != "answer":
            self.state["num_calls_in_turn"] += int(parsed.kind == "tool_call")
            return super().step(action)
        return self._end_user_turn(parsed.answer)

    # -- internals
    def _runner(self, class_name: str, name: str) -> Callable[..., str]:
        def run(**arguments: Any) -> str:
            # looked up at call time, so after `restore` the restored instances run
            text, err = execute(self.state["instances"][class_name], name, arguments)
            self.state["results"].append(text)
            if err is not None:
                raise err
            return text
        return run

    def _fresh_instances(self, row: dict[str, Any]) -> dict[str, Any]:
        extra = row["extra_info"]
        return make_instances(extra["involved_classes"], extra["initial_config"],
                              long_context="long_context" in extra["category"])

    def _expected_turns(self, row: dict[str, Any]) -> list[tuple[dict[str, Any], list[str]]]:
        """Per user turn: (instances after the ground-truth calls of turns <= k, that turn's results)."""
        key = (row["data_source"], row["extra_info"]["case_id"])
        if key not in self._expected_cache:
            instances, expected = self._fresh_instances(row), []
            for calls in row["reward_model"]["ground_truth"]["turns"]:
                # a deep copy: APIs keep argument lists in their state and extend them later
                results = [execute(instances[self._owner(c["name"])], c["name"], copy.deepcopy(c["arguments"]))[0]
                           for c in calls]
                expected.append((copy.deepcopy(instances), results))
            self._expected_cache[key] = expected
        return self._expected_cache[key]

    def _owner(self, name: str) -> str:
        return function_owners(self.row["extra_info"]["involved_classes"])[name]

    def _check_turn(self, turn: int) -> dict[str, Any]:
        """BFCL's per-turn check (see the module docstring); {"valid": True} or BFCL's error dict."""
        expected_instances, expected_results = self._expected[turn]
        if not self.row["reward_model"]["ground_truth"]["turns"][turn]:
            return {"valid": True}  # BFCL checks nothing on a turn whose ground truth is empty
        if self.state["num_calls_in_turn"] == 0:
            return {"valid": False, "error_type": "multi_turn:empty_turn_model_response"}
        check = self._bfcl.state_checker(self.state["instances"], expected_instances)
        if check["valid"]:
            check = self._bfcl.response_checker(self.state["results"], expected_results, turn)
        return check

    def _end_user_turn(self, answer: str) -> StepResult:
        turn = self.state["user_turn"]
        check = self._check_turn(turn)
        info: dict[str, Any] = {"answer": answer, "user_turn": turn}
        if not check["valid"]:
            return StepResult("", True, reward=0.0, info={**info, "failed_check": check.get("error_type", "")})
        user_turns = self.row["extra_info"]["user_turns"]
        if turn + 1 < len(user_turns):
            self.state["user_turn"], self.state["num_calls_in_turn"] = turn + 1, 0
            return StepResult(user_turns[turn + 1], False, info={**info, "role": "user"})
        return StepResult("", True, reward=1.0, info=info)


class BfclDomain(Domain):
    """Rows of one BFCL multi-turn category, split by a hash of the case id; expert replays the ground truth."""

    def __init__(self, category: str = "multi_turn_base", test_fraction: float = 0.5) -> None:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction={test_fraction} must be strictly between 0 and 1")
        self.category, self.test_fraction = category, test_fraction
        self.name = f"bfcl_{category}"
        self.cases = load_cases(category)
        self._expected_cache: dict[Any, Any] = {}

    def case_ids(self, split: str) -> list[str]:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}; use 'train' or 'test'")
        return [c["id"] for c, _ in self.cases if split_of(c["id"], self.test_fraction) == split]

    def rows(self, split: str, num: int, seed: int = 0) -> list[dict[str, Any]]:
        ids = self.case_ids(split)
        if num > len(ids):
            raise ValueError(f"{self.name} has {len(ids)} {split} cases; asked for {num}")
        by_id = {case["id"]: (case, answer) for case, answer in self.cases}
        order = np.random.default_rng(seed).permutation(len(ids))[:num]
        return [self._row(*by_id[ids[j]], split, i) for i, j in enumerate(order)]

    def _row(self, case: dict[str, Any], answer: dict[str, Any], split: str, index: int) -> dict[str, Any]:
        owners = function_owners(case["involved_classes"])
        user_turns = ["\n".join(m["content"] for m in turn) for turn in case["question"]]
        truth = {"case_id": case["id"], "turns": [[parse_call(c, owners) for c in calls]
                                                  for calls in answer["ground_truth"]]}
        return make_row(self.name, user_turns[0], truth, split=split, index=index, system=SYSTEM_PROMPT,
                        case_id=case["id"], category=self.category, involved_classes=case["involved_classes"],
                        initial_config=case["initial_config"], user_turns=user_turns)

    def make_env(self) -> BfclEnv:
        return BfclEnv(self._expected_cache)

    def expert_turn(self, row: dict[str, Any], turns: Sequence[tuple[str, str]], rng: np.random.Generator) -> str:
        """Replays the ground truth: each user turn's calls in order, then `<answer>done</answer>`.

        Assumes `turns` is the expert's own history."""
        script = []
        for calls in row["reward_model"]["ground_truth"]["turns"]:
            script += [format_tool_call(c["name"], c["arguments"]) for c in calls] + ["<answer>done</answer>"]
        return script[min(len(turns), len(script) - 1)]
