"""Built-in function-calling suite ("funcall"): three small stateful APIs and generated tasks over them.

The APIs are plain Python objects held in `env.state["apis"]` (so snapshot/restore resumes them exactly):

- files: a folder tree with a working folder; tools `ls`, `cd`, `mkdir`, `write`, `cat`
- bank: named accounts with integer balances; tools `balance`, `deposit`, `transfer`
- calendar: named events on weekdays; tools `add_event`, `list_events`, `cancel_event`

A task (1-3 required calls) is drawn from eleven templates over a random small world, e.g. "Create a folder named
notes and write 'buy milk' into a file named todo.txt inside it." or "Transfer 30 from alice to bob, then tell me
the balance of alice." The ground truth (`reward_model.ground_truth`) is JSON: the required calls, the final state
reached by running them on the initial state (`extra_info.initial_state`), and the answer when one is asked for.

Reward rule: 1.0 iff, when the model gives `<answer>`,
  (a) the final state equals the ground-truth state (the working folder is navigation, not outcome, and is ignored),
  (b) every ground-truth call was executed without error (multiset inclusion: order-insensitive, extra calls
      allowed, numbers compared by value), and
  (c) where the task asks for a value, the answer matches it (case, spaces, quotes, a final period and
      number formatting ignored).
Order is not compared directly: where it matters (write into a folder after creating it and moving into it, read
a balance after a transfer) a wrong order changes the final state or the answer, so (a) and (c) catch it.

Splits: a task belongs to "test" iff a hash of its question text falls in the test fraction, so train and test
never share a question, whatever the seed. All names come from fixed word lists, so every word of a test question
also appears in training questions (a tiny model can copy it; see docs/design.md, section 6).

Does not: paraphrase questions, ask for values the APIs cannot give, or grade the wording of an answer beyond (c).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tracerl.core.history import History
from tracerl.io.domains.base import Domain, ToolEnv, make_row
from tracerl.io.env.actions import Tool
from tracerl.io.files.boundary import listing
from tracerl.io.files.rows import non_finite

DATA_SOURCE = "funcall"
TEST_FRACTION = 0.2  # share of question texts that belong to the test split
MAX_NAME_CHARS = 40
MAX_TEXT_CHARS = 1000
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
FOLDERS = ("notes", "photos", "music", "work", "games", "recipes", "travel", "school", "drafts", "backup")
FILES = ("todo.txt", "plan.txt", "list.txt", "ideas.txt", "log.txt", "readme.txt")
NOTES = ("buy milk", "call mom", "pay rent", "fix bike", "read book", "water plants", "walk dog", "bake bread")
ACCOUNTS = ("alice", "bob", "carol", "dave", "erin", "frank")
TITLES = ("dentist", "meeting", "lunch", "gym", "party", "review", "concert", "haircut")


# ---------------------------------------------------------------- the APIs

def _check_name(name: str) -> None:
    if not name or len(name) > MAX_NAME_CHARS or "/" in name or name in (".", ".."):
        raise ValueError(f"invalid name {name[:MAX_NAME_CHARS]!r}: use 1-{MAX_NAME_CHARS} characters without '/'")


class FileSystem:
    """Folders are dicts, files are strings; `cwd` is the path of the working folder from the root."""

    def __init__(self, files: dict[str, Any], cwd: Sequence[str] = ()) -> None:
        self.files = files
        self.cwd = list(cwd)

    def _here(self) -> dict[str, Any]:
        node = self.files
        for part in self.cwd:
            node = node[part]
        return node

    def ls(self) -> str:
        names = sorted(n + "/" if isinstance(v, dict) else n for n, v in self._here().items())
        return " ".join(names) or "(empty folder)"

    def cd(self, folder: str) -> str:
        if folder == "/":
            self.cwd = []
        elif folder == "..":
            if not self.cwd:
                raise ValueError("already at the root")
            self.cwd.pop()
        elif isinstance(self._here().get(folder), dict):
            self.cwd.append(folder)
        else:
            raise ValueError(f"no folder named {folder[:MAX_NAME_CHARS]!r} here")
        return "/" + "/".join(self.cwd)

    def mkdir(self, name: str) -> str:
        _check_name(name)
        if name in self._here():
            raise ValueError(f"{name!r} already exists")
        self._here()[name] = {}
        return f"created folder {name}"

    def write(self, file: str, text: str) -> str:
        _check_name(file)
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"text is {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
        if isinstance(self._here().get(file), dict):
            raise ValueError(f"{file!r} is a folder")
        self._here()[file] = text
        return f"wrote {len(text)} characters to {file}"

    def cat(self, file: str) -> str:
        content = self._here().get(file)
        if not isinstance(content, str):
            raise ValueError(f"no file named {file[:MAX_NAME_CHARS]!r} here")
        return content


class Bank:
    def __init__(self, accounts: dict[str, int]) -> None:
        self.accounts = accounts

    def _known(self, account: str) -> str:
        if account not in self.accounts:
            raise ValueError(f"no account named {account[:MAX_NAME_CHARS]!r}")
        return account

    def balance(self, account: str) -> str:
        return str(self.accounts[self._known(account)])

    def deposit(self, account: str, amount: int) -> str:
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.accounts[self._known(account)] += amount
        return f"deposited {amount} into {account}"

    def transfer(self, source: str, target: str, amount: int) -> str:
        self._known(source)
        self._known(target)
        if amount <= 0 or source == target:
            raise ValueError("amount must be positive and the accounts different")
        if self.accounts[source] < amount:
            raise ValueError(f"insufficient funds in {source}")
        self.accounts[source] -= amount
        self.accounts[target] += amount
        return f"transferred {amount} from {source} to {target}"


class Calendar:
    """Events are {"title", "day"} dicts kept sorted by title, so equal calendars compare equal."""

    def __init__(self, events: list[dict[str, str]]) -> None:
        self.events = events

    @staticmethod
    def _day(day: str) -> str:
        if day not in DAYS:
            raise ValueError(f"day must be one of {list(DAYS)}")
        return day

    def add_event(self, title: str, day: str) -> str:
        _check_name(title)
        if any(e["title"] == title for e in self.events):
            raise ValueError(f"an event named {title!r} already exists")
        self.events.append({"title": title, "day": self._day(day)})
        self.events.sort(key=lambda e: e["title"])
        return f"added {title} on {day}"

    def list_events(self, day: str) -> str:
        titles = [e["title"] for e in self.events if e["day"] == self._day(day)]
        return f"{len(titles)} event(s) on {day}" + (": " + ", ".join(titles) if titles else "")

    def cancel_event(self, title: str) -> str:
        kept = [e for e in self.events if e["title"] != title]
        if len(kept) == len(self.events):
            raise ValueError(f"no event named {title[:MAX_NAME_CHARS]!r}")
        self.events[:] = kept
        return f"cancelled {title}"


@dataclass(frozen=True)
class ToolSpec:
    api: str  # key in state["apis"]
    description: str
    properties: dict[str, Any]


def _str(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


AMOUNT = {"type": "integer", "description": "a positive whole amount"}
TOOL_SPECS: dict[str, ToolSpec] = {
    "ls": ToolSpec("files", "List the working folder (folders end with '/').", {}),
    "cd": ToolSpec("files", "Change the working folder.", {"folder": _str("a folder here, '..' or '/'")}),
    "mkdir": ToolSpec("files", "Create a folder in the working folder.", {"name": _str("the new folder's name")}),
    "write": ToolSpec("files", "Write text into a file in the working folder (creates or replaces it).",
                      {"file": _str("the file name"), "text": _str("the text to write")}),
    "cat": ToolSpec("files", "Read a file in the working folder.", {"file": _str("the file name")}),
    "balance": ToolSpec("bank", "The balance of an account.", {"account": _str("the account name")}),
    "deposit": ToolSpec("bank", "Deposit money into an account.", {"account": _str("the account name"),
                                                                    "amount": AMOUNT}),
    "transfer": ToolSpec("bank", "Move money from one account to another.",
                         {"source": _str("the account to take from"), "target": _str("the account to pay into"),
                          "amount": AMOUNT}),
    "add_event": ToolSpec("calendar", "Add an event on a weekday.",
                          {"title": _str("the event's name"), "day": _str("a weekday in lower case, e.g. monday")}),
    "list_events": ToolSpec("calendar", "The events on a weekday.", {"day": _str("a weekday in lower case")}),
    "cancel_event": ToolSpec("calendar", "Remove an event.", {"title": _str("the event's name")}),
}


def build_apis(initial_state: dict[str, Any]) -> dict[str, Any]:
    """Fresh API objects on a deep copy of `initial_state` ({"files", "accounts", "events"})."""
    world = copy.deepcopy(initial_state)
    return {"files": FileSystem(world["files"]), "bank": Bank(world["accounts"]), "calendar": Calendar(world["events"])}


def api_state(apis: dict[str, Any]) -> dict[str, Any]:
    """The comparable (JSON) state of the APIs; the working folder is deliberately left out."""
    return copy.deepcopy({"files": apis["files"].files, "accounts": apis["bank"].accounts,
                          "events": apis["calendar"].events})


def run_call(apis: dict[str, Any], name: str, arguments: dict[str, Any]) -> str:
    return getattr(apis[TOOL_SPECS[name].api], name)(**arguments)


# ---------------------------------------------------------------- scoring

def normalize_answer(text: str) -> str:
    """Lower case, single spaces, no surrounding quotes or final period; finite numbers in one canonical form (a
    non-finite one, "inf" or "1e400", stays as written: no two of them are equal by value)."""
    text = " ".join(str(text).lower().split()).strip("'\"` ").rstrip(".").strip()
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return text
    if non_finite(value):
        return text
    return str(int(value)) if value.is_integer() else repr(value)


def _call_key(call: dict[str, Any]) -> str:
    arguments = {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                 for k, v in call["arguments"].items()}
    return json.dumps({"name": call["name"], "arguments": arguments}, sort_keys=True)


def calls_included(required: Sequence[dict[str, Any]], executed: Sequence[dict[str, Any]]) -> bool:
    """Every required call is among the executed ones, counted with multiplicity, in any order."""
    return not (Counter(map(_call_key, required)) - Counter(map(_call_key, executed)))


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The policy text of one tool call, in the format `tracerl.io.env.actions.parse_action` reads."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# ---------------------------------------------------------------- state features for the success predictor

def history_state(history: History) -> dict[str, float]:
    """One-hot features of a prefix, from its text only (never the gold calls or state): calls that ran, calls
    that failed (an observation starting 'error:'), and whether the last call ran or failed."""
    results = [line for line in history.text.split("\n")[1:] if line and "<tool_call>" not in line]
    failed = sum(line.startswith("error:") for line in results)
    calls = history.text.count("<tool_call>")
    last = "none" if not calls else "error" if results and results[-1].startswith("error:") else "ran"
    return {f"calls_ran={min(max(calls - failed, 0), 4)}": 1.0, f"calls_failed={min(failed, 2)}": 1.0,
            f"last={last}": 1.0}




# ---------------------------------------------------------------- environment

class FuncallEnv(ToolEnv):
    """One task: state = {"apis": the three API objects, "calls": the calls that ran without error}."""

    def __init__(self) -> None:
        super().__init__()
        # the tools look the API up in self.state at call time, so a restored state is the one that runs
        self._tools = {name: Tool(name, spec.description, {"type": "object", "properties": spec.properties,
                                                           "required": sorted(spec.properties)},
                                  fn=self._runner(name))
                       for name, spec in TOOL_SPECS.items()}

    def _runner(self, name: str) -> Callable[..., str]:
        def run(**arguments: Any) -> str:
            result = run_call(self.state["apis"], name, arguments)  # raises on bad use; call_tool reports it
            self.state["calls"].append({"name": name, "arguments": copy.deepcopy(arguments)})
            return result
        return run

    def initial_state(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"apis": build_apis(row["extra_info"]["initial_state"]), "calls": []}

    def tool_table(self) -> dict[str, Tool]:
        return self._tools

    def score(self, answer: str) -> float:
        truth = self.row["reward_model"]["ground_truth"]
        state_ok = api_state(self.state["apis"]) == truth["final_state"]
        calls_ok = calls_included(truth["calls"], self.state["calls"])
        answer_ok = truth["answer"] is None or normalize_answer(answer) == normalize_answer(truth["answer"])
        return float(state_ok and calls_ok and answer_ok)


# ---------------------------------------------------------------- task generation

def _pick(rng: random.Random, items: Sequence[Any]) -> Any:
    return items[rng.randrange(len(items))]


def random_world(rng: random.Random) -> dict[str, Any]:
    """A small initial state: 3 folders (the first holds a file), 3 accounts, 3 events."""
    files: dict[str, Any] = {}
    for i, folder in enumerate(rng.sample(FOLDERS, 3)):
        names = rng.sample(FILES, rng.randint(1 if i == 0 else 0, 2))
        files[folder] = {name: _pick(rng, NOTES) for name in names}
    accounts = {a: rng.randint(5, 50) * 10 for a in rng.sample(ACCOUNTS, 3)}
    events = sorted(({"title": t, "day": _pick(rng, DAYS)} for t in rng.sample(TITLES, 3)),
                    key=lambda e: e["title"])
    return {"files": files, "accounts": accounts, "events": events}


Task = tuple[str, list[tuple[str, dict[str, Any]]], str | None]  # question, required calls, answer


def _amount(rng: random.Random, balance: int) -> int:
    return 10 * rng.randint(1, min(balance, 100) // 10)


def _make_note(rng, world) -> Task:
    folder = _pick(rng, [f for f in FOLDERS if f not in world["files"]])
    file, text = _pick(rng, FILES), _pick(rng, NOTES)
    return (f"Create a folder named {folder} and write '{text}' into a file named {file} inside it.",
            [("mkdir", {"name": folder}), ("cd", {"folder": folder}), ("write", {"file": file, "text": text})], None)


def _read_note(rng, world) -> Task:
    folder = _pick(rng, [f for f, content in world["files"].items() if content])
    file = _pick(rng, sorted(world["files"][folder]))
    return (f"What does the file {file} in the folder {folder} say?",
            [("cd", {"folder": folder}), ("cat", {"file": file})], world["files"][folder][file])


def _write_note(rng, world) -> Task:
    folder = _pick(rng, sorted(world["files"]))
    file, text = _pick(rng, [f for f in FILES if f not in world["files"][folder]]), _pick(rng, NOTES)
    return (f"Write '{text}' into a new file named {file} in the folder {folder}.",
            [("cd", {"folder": folder}), ("write", {"file": file, "text": text})], None)


def _transfer(rng, world, then_balance: bool = False) -> Task:
    source, target = rng.sample(sorted(world["accounts"]), 2)
    amount = _amount(rng, world["accounts"][source])
    calls = [("transfer", {"source": source, "target": target, "amount": amount})]
    if not then_balance:
        return f"Transfer {amount} from {source} to {target}.", calls, None
    return (f"Transfer {amount} from {source} to {target}, then tell me the balance of {source}.",
            calls + [("balance", {"account": source})], str(world["accounts"][source] - amount))


def _balance(rng, world) -> Task:
    account = _pick(rng, sorted(world["accounts"]))
    return f"What is the balance of {account}?", [("balance", {"account": account})], str(world["accounts"][account])


def _deposit_then_balance(rng, world) -> Task:
    account, amount = _pick(rng, sorted(world["accounts"])), 10 * rng.randint(1, 10)
    return (f"Deposit {amount} into {account} and tell me the new balance.",
            [("deposit", {"account": account, "amount": amount}), ("balance", {"account": account})],
            str(world["accounts"][account] + amount))


def _add_event(rng, world, then_count: bool = False) -> Task:
    title = _pick(rng, [t for t in TITLES if all(e["title"] != t for e in world["events"])])
    day = _pick(rng, DAYS)
    calls = [("add_event", {"title": title, "day": day})]
    if not then_count:
        return f"Add an event called {title} on {day}.", calls, None
    count = 1 + sum(e["day"] == day for e in world["events"])
    return (f"Add an event called {title} on {day}, then tell me how many events I have on {day}.",
            calls + [("list_events", {"day": day})], str(count))


def _cancel_event(rng, world) -> Task:
    title = _pick(rng, world["events"])["title"]
    return f"Cancel the event {title}.", [("cancel_event", {"title": title})], None


def _move_event(rng, world) -> Task:
    event = _pick(rng, world["events"])
    day = _pick(rng, [d for d in DAYS if d != event["day"]])
    return (f"Move the event {event['title']} to {day}.",
            [("cancel_event", {"title": event["title"]}), ("add_event", {"title": event["title"], "day": day})], None)


TEMPLATES: dict[str, Callable[[random.Random, dict[str, Any]], Task]] = {
    "make_note": _make_note, "read_note": _read_note, "write_note": _write_note,
    "transfer": _transfer, "transfer_then_balance": lambda rng, w: _transfer(rng, w, then_balance=True),
    "balance": _balance, "deposit_then_balance": _deposit_then_balance,
    "add_event": _add_event, "add_then_count": lambda rng, w: _add_event(rng, w, then_count=True),
    "cancel_event": _cancel_event, "move_event": _move_event,
}


def split_of(question: str) -> str:
    """'test' for a fixed TEST_FRACTION of question texts (by hash), else 'train'."""
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 16 ** 8
    return "test" if bucket < TEST_FRACTION else "train"


@dataclass
class FuncallDomain(Domain):
    """Rows of the built-in suite, its environment, and a scripted expert that replays the required calls."""

    # template -> weight of drawing it (normalised; a template left out is never drawn); {} = all eleven, uniform
    templates: dict[str, float] = field(default_factory=dict)

    name = DATA_SOURCE

    def __post_init__(self) -> None:
        unknown = set(self.templates) - set(TEMPLATES)
        if unknown:
            raise ValueError(f"funcall templates names {listing(unknown)}; choose from {sorted(TEMPLATES)}")
        if self.templates and (any(not w >= 0 for w in self.templates.values()) or sum(self.templates.values()) <= 0):
            raise ValueError(f"funcall template weights must be >= 0 with a positive sum; got {self.templates}")

    def state_features(self, history: History) -> dict[str, float]:
        """What the predictor reads of a history's state (`history_state`)."""
        return history_state(history)

    def rows(self, split: str, num: int, seed: int = 0) -> list[dict[str, Any]]:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}; use 'train' or 'test'")
        rng = random.Random(f"funcall-{seed}-{split}")  # stdlib: ~10x faster than numpy for scalar draws
        rows: list[dict[str, Any]] = []
        while len(rows) < num:
            world = random_world(rng)
            task = _pick(rng, sorted(TEMPLATES)) if not self.templates else \
                rng.choices(list(self.templates), weights=list(self.templates.values()))[0]
            question, calls, answer = TEMPLATES[task](rng, world)
            if split_of(question) != split:
                continue
            apis = build_apis(world)
            for name, arguments in calls:
                run_call(apis, name, arguments)  # a generated call that raises is a bug in its template
            truth = {"calls": [{"name": n, "arguments": a} for n, a in calls],
                     "final_state": api_state(apis), "answer": answer}
            rows.append(make_row(DATA_SOURCE, question, truth, split=split, index=len(rows), task=task,
                                 initial_state=world))
        return rows

    def make_env(self) -> FuncallEnv:
        return FuncallEnv()

    def expert_turn(self, row: dict[str, Any], turns: Sequence[tuple[str, str]], rng: np.random.Generator) -> str:
        """The next required call in order, then the answer ('done' when none is asked).

        Assumes `turns` is the expert's own history (one turn per required call)."""
        truth = row["reward_model"]["ground_truth"]
        if len(turns) < len(truth["calls"]):
            call = truth["calls"][len(turns)]
            return format_tool_call(call["name"], call["arguments"])
        return f"<answer>{truth['answer'] if truth['answer'] is not None else 'done'}</answer>"
