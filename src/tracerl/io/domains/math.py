"""Math word problems and arithmetic with a sandboxed Python tool; reward = numeric match of the answer.

`MathDomain` draws rows offline from reasoning-gym generators (`gsm_symbolic`: GSM8K-style word problems;
`basic_arithmetic`, `chain_sum`, `products`: expressions), mixed by weight and seeded. Each question goes
to train or test by a hash of its text, so the splits never share a question whatever the seed or size.
Arithmetic rows whose shown expression does not equal the generator's answer (its `/` is floor
division, about 0.7% of `basic_arithmetic`) are dropped, so every ground truth is what the question says.
`MathEnv` gives the policy one tool, `python(code)`, run in `tracerl.io.sandbox` (a separate process with
CPU, memory and wall-clock limits), and scores `<answer>` by `numeric_match`. `load_math_file` reads
GSM8K-style (`#### 42`) and MATH-style (`\\boxed{...}`) JSONL or parquet into the same rows.

The scripted expert writes Python in turn 1 and answers with its output in turn 2. For arithmetic rows the
program is the question's own expression (`print(3 * (4 - 1))`); gsm_symbolic and file rows carry no
program, so there it prints the ground truth (`print(560)`), an honest shortcut, not a derivation.
Not here: LLM-judged or symbolic (sympy) equivalence; MATH answers that are not numbers are scored by
whitespace- and `$`-insensitive string equality only.

reasoning-gym is imported only when rows are generated. Install line used (no torch; it pulls sympy,
matplotlib via cellpylib, and small pure-Python packages, all imported by its package `__init__`):
    pip install reasoning-gym==0.1.25
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import math
import operator
import os
import re
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tracerl.core.history import History
from tracerl.io.domains.base import Domain, ToolEnv, make_row
from tracerl.io.env import StepResult
from tracerl.io.env.actions import Tool, parse_action
from tracerl.io.files import read_utf8
from tracerl.io.files.boundary import listing
from tracerl.io.files.rows import check_row, non_finite, parquet_records

GENERATORS = ("gsm_symbolic", "basic_arithmetic", "chain_sum", "products")
DEFAULT_MIX = {"gsm_symbolic": 0.5, "basic_arithmetic": 0.25, "chain_sum": 0.25}
SYSTEM_PROMPT = ("Solve the problem. You can run Python with the python tool; print what you need. "
                 "Give the final answer as a number in <answer>...</answer>.")
MAX_ANSWER_CHARS = 2_000  # only the end of an answer is searched for its last number
PYTHON_TOOL_DOC = "Run a Python 3 program in a sandbox and return its stdout (or the error)."


# -- numbers -------------------------------------------------------------------------------------

# linear time: each group scans brace-free text once (a lazy `+?` before `\s*\}` is quadratic per \frac)
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]+)\}\s*\{([^{}]+)\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_UNSIGNED = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,3})?"  # exponent capped: Fraction("1e99999999") hangs
# A minus right after a digit or ")" is subtraction ("3-2"), not the sign of the next number.
_NUMBER = re.compile(rf"((?<![\d)])-)?({_UNSIGNED})(?:\s*/\s*(-?{_UNSIGNED}))?")


def _last_number(text: str) -> tuple[Fraction, bool] | None:
    """The exact value of the last number in `text`, and whether it is written as a plain integer."""
    text = text[-4 * MAX_ANSWER_CHARS:]  # only the end is searched; cut before any pattern runs
    text = _FRAC.sub(lambda m: f" {m.group(1).strip()}/{m.group(2).strip()} ",
                     text.replace("$", "").replace("\\!", "").replace("\u2212", "-"))
    text = _THOUSANDS.sub("", text)
    matches = list(_NUMBER.finditer(text[-MAX_ANSWER_CHARS:]))
    if not matches:
        return None
    sign, numerator, denominator = matches[-1].groups()
    try:
        value = Fraction(numerator) / Fraction(denominator) if denominator else Fraction(numerator)
    except (ZeroDivisionError, ValueError):
        return None
    return (-value if sign else value), denominator is None and numerator.rstrip(".").isdigit()


def parse_number(text: str) -> float | None:
    """The last number in `text`, or None.

    Accepts thousands commas (1,234), `$` and LaTeX `\\!` (dropped), fractions (3/4, \\frac{3}{4}),
    scientific notation (1e3), a sign, and a trailing period ("12.")."""
    parsed = _last_number(text)
    if parsed is None:
        return None
    try:
        return float(parsed[0])
    except OverflowError:  # copysign(inf, parsed[0]) would convert the Fraction, and overflow again
        return math.inf if parsed[0] > 0 else -math.inf


def numeric_match(answer: str, ground_truth: str, rel_tol: float = 1e-6) -> bool:
    """True iff the last numbers a of `answer` and g of `ground_truth` agree.

    Both written as plain integers: a == g exactly (so 1000001 is not 1000000). Otherwise (a decimal point,
    exponent or fraction on either side): |a - g| <= max(rel_tol * max(|a|, |g|), 1e-9), in exact arithmetic."""
    a, g = _last_number(answer), _last_number(str(ground_truth))
    if a is None or g is None:
        return False
    (a, a_int), (g, g_int) = a, g
    if a == g or (a_int and g_int):
        return a == g
    return abs(a - g) <= max(Fraction(rel_tol) * max(abs(a), abs(g)), Fraction(1, 10**9))


def _normalise(text: str) -> str:
    return re.sub(r"\s+|\$|\\!|\\left|\\right|\.$", "", text.strip())


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def exact_value(expression: str) -> Fraction | None:
    """The exact rational value of an integer +-*/ expression with parentheses; None if it is anything else."""
    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -walk(node.operand) if isinstance(node.op, ast.USub) else walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unsupported syntax {type(node).__name__}")
    try:
        return walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


_PLAIN = re.compile(r"-?\d+(?:\.\d+)?")


def _exact_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        return None


# -- environment ---------------------------------------------------------------------------------

class MathEnv(ToolEnv):
    """One tool, `python(code)`; the episode ends at `<answer>`, reward 1.0 iff it matches the ground truth.

    Each call is a fresh sandboxed process (no state carries between calls), so `self.state` holds only a
    call count. A program that raises, times out or hits a limit returns its error as the observation and
    marks the turn `tool_error`. A broken sandbox (`SandboxError`: the host cannot run it) is not the
    model's fault and is re-raised. `limits` is a `tracerl.io.sandbox.SandboxLimits`; None: its defaults."""

    def __init__(self, limits: Any = None, rel_tol: float = 1e-6, pool: Executor | None = None) -> None:
        super().__init__()
        self.limits = limits
        self.rel_tol = rel_tol
        self.pool = pool  # runs `prefetch`ed programs; None: every program runs when its turn is stepped
        self._prefetched: dict[str, Future] = {}
        self._last_call_failed = False
        self._host_error: Exception | None = None

    def prefetch(self, action: str) -> None:
        """Start the program of a python call in the domain's pool before `step(action)` asks for it: the driver
        calls this for every turn of a batch first, so a batch's sandboxes run side by side. The program runs
        exactly as `step` would run it (same sandbox, same limits); only when changes."""
        parsed = parse_action(action)
        code = parsed.arguments.get("code") if parsed.kind == "tool_call" and parsed.name == "python" else None
        if self.pool is not None and isinstance(code, str) and code not in self._prefetched:
            self._prefetched[code] = self.pool.submit(self._run, code)

    def _run(self, code: str) -> Any:
        from tracerl.io.sandbox import SandboxLimits, run_python  # lazy: see the module doc

        return run_python(code, self.limits if self.limits is not None else SandboxLimits())

    def initial_state(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"num_python_calls": 0}

    def tool_table(self) -> dict[str, Tool]:
        parameters = {"type": "object", "properties": {"code": {"type": "string", "description": "Python source"}},
                      "required": ["code"]}
        return {"python": Tool("python", PYTHON_TOOL_DOC, parameters, self._python)}

    def _python(self, code: str) -> str:
        from tracerl.io.sandbox import SandboxError  # lazy: see the module doc

        self.state["num_python_calls"] += 1
        pending = self._prefetched.pop(code, None)
        try:
            result = pending.result() if pending is not None else self._run(code)
        except SandboxError as err:  # call_tool would turn it into an observation; `step` re-raises it
            self._host_error = err
            raise
        self._last_call_failed = not result.ok
        return result.observation()

    def step(self, action: str) -> StepResult:
        self._last_call_failed, self._host_error = False, None
        result = super().step(action)
        if self._host_error is not None:
            raise self._host_error
        result.tool_error = result.tool_error or self._last_call_failed
        return result

    def score(self, answer: str) -> float:
        truth = str(self.row["reward_model"]["ground_truth"])
        if not _finite_truth(truth):  # refused by the loaders; a row built in code matches nothing
            return 0.0
        if parse_number(truth) is None:  # a MATH answer such as "\sqrt{2}" or "(1, 2)"
            return float(_normalise(answer) == _normalise(truth))
        return float(numeric_match(answer, truth, self.rel_tol))


# -- domain --------------------------------------------------------------------------------------

def _check_generator_options(options: dict[str, dict[str, Any]]) -> None:
    """Every option is a field of its generator's reasoning-gym config, and the config accepts the values."""
    from reasoning_gym.factory import DATASETS  # lazy: only a config that sets generator options pays for it

    for name, values in options.items():
        config_class = DATASETS[name][1]
        known = sorted(f.name for f in dataclasses.fields(config_class) if f.name not in ("seed", "size"))
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"math generator_options[{name!r}] has {listing(unknown)}; {name} takes {known}")
        try:
            config_class(**values).validate()
        except (AssertionError, TypeError, ValueError) as err:
            raise ValueError(f"math generator_options[{name!r}] = {values} is refused by {name}: {err}") from None


def _split_of(question: str, test_fraction: float) -> str:
    bucket = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big") / 2**64
    return "test" if bucket < test_fraction else "train"


def _derived_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "big")


@dataclass
class MathDomain(Domain):
    """Rows from reasoning-gym generators; the seed of a draw is the `seed` argument of `rows`."""

    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))  # generator -> weight (normalised)
    test_fraction: float = 0.2  # share of all questions (by hash of the text) held out for the test split
    limits: Any = None  # SandboxLimits for the python tool; None: the sandbox's defaults (5 s, 512 MB)
    # generator -> options of its reasoning-gym config (e.g. {"chain_sum": {"max_digits": 2}}: shorter numbers)
    generator_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False, compare=False)

    name = "math"

    def state_features(self, history: History) -> dict[str, float]:
        """What the predictor reads of a history's state (`history_state`)."""
        return history_state(history)

    def __post_init__(self) -> None:
        unknown = set(self.mix) - set(GENERATORS)
        if unknown:
            raise ValueError(f"math mix names unknown generator(s) {listing(unknown)}; choose from "
                             f"{list(GENERATORS)}")
        if not self.mix or any(not w >= 0 for w in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError(f"math mix weights must be >= 0 with a positive sum; got {self.mix}")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"math test_fraction={self.test_fraction} must lie strictly between 0 and 1")
        self.mix = {name: w for name, w in self.mix.items() if w > 0}
        stray = set(self.generator_options) - set(self.mix)
        if stray:
            raise ValueError(f"math generator_options names {listing(stray)}, which the mix {sorted(self.mix)} does "
                             "not draw")
        if self.generator_options:
            _check_generator_options(self.generator_options)

    def rows(self, split: str, num: int, seed: int = 0) -> list[dict[str, Any]]:
        """`num` distinct questions of `split`, drawn generator by generator with probabilities `mix`."""
        assert split in ("train", "test"), split
        import reasoning_gym  # lazy: 1-2 s to import, and not needed to score or to load files

        names = list(self.mix)
        p_generator = np.array([self.mix[n] for n in names]) / sum(self.mix.values())
        capacity = 50 * num + 1000  # virtual dataset size; only the entries actually drawn are generated
        datasets = {n: reasoning_gym.create_dataset(n, seed=_derived_seed(seed, split, n), size=capacity,
                                                    **self.generator_options.get(n, {}))
                    for n in names}
        cursors = dict.fromkeys(names, 0)
        rng = np.random.default_rng(_derived_seed(seed, split, "mix"))
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        while len(out) < num:
            name = names[rng.choice(len(names), p=p_generator)]
            if cursors[name] >= capacity:
                raise RuntimeError(f"math generator {name} ran out of distinct {split} questions after {capacity}")
            entry = datasets[name][cursors[name]]
            cursors[name] += 1
            question, truth = entry["question"], str(entry["answer"])
            if question in seen or _split_of(question, self.test_fraction) != split or parse_number(truth) is None:
                continue
            expression = entry["metadata"].get("expression")
            if expression is not None:
                value = exact_value(expression)
                if value is None or value != _exact_number(truth):
                    continue  # the shown expression does not give the generator's answer
            seen.add(question)
            out.append(make_row(f"math/{name}", question, truth, split=split, index=len(out),
                                system=SYSTEM_PROMPT, generator=name, expression=expression))
        return out

    def make_env(self) -> MathEnv:
        return MathEnv(self.limits, pool=self._sandbox_pool())

    def _sandbox_pool(self) -> ThreadPoolExecutor:
        """The threads that run prefetched programs, made on first use (a domain sent to a Ray worker holds none):
        as many as the machine has cores, each waiting on its own sandbox process."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1),
                                            thread_name_prefix="tracerl-sandbox")
        return self._pool

    def __getstate__(self) -> dict[str, Any]:  # a pool does not pickle; the copy makes its own
        return {**self.__dict__, "_pool": None}

    def expert_turn(self, row: dict[str, Any], turns: Sequence[tuple[str, str]], rng: np.random.Generator) -> str:
        """Turn 1: a program (the question's expression if it has one, else `print(ground truth)`);
        turn 2: `<answer>` with the program's output. Deterministic; `rng` is unused."""
        if turns:
            return f"<answer>{turns[-1][1].strip()}</answer>"
        expression = row["extra_info"].get("expression")
        truth = str(row["reward_model"]["ground_truth"])
        code = f"print({expression or (truth if _PLAIN.fullmatch(truth) else repr(truth))})"
        call = json.dumps({"name": "python", "arguments": {"code": code}})
        return f"Let me compute it with Python.\n<tool_call>{call}</tool_call>"


# -- state features for the success predictor ---------------------------------------------------

_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def history_state(history: History) -> dict[str, float]:
    """One-hot features of a math prefix, from its text only (never the gold answer): numbers in the question
    (its size), programs run so far, and what the last one printed (a bare number, an error, other text)."""
    lines = history.text.split("\n")
    calls = sum("<tool_call>" in line for line in lines)
    _, closed, after = history.text.rpartition("</tool_call>")
    after = after.strip() if closed else ""  # a call cut off before its closing tag printed nothing
    last = "none" if not calls else "error" if re.search(r"Error|Traceback|timed out", after) else \
        "number" if _PLAIN_NUMBER.fullmatch(after.split("\n")[0].strip()) else "text"
    return {f"question_numbers={min(len(_PLAIN_NUMBER.findall(lines[0])), 8)}": 1.0, f"calls={min(calls, 3)}": 1.0,
            f"last={last}": 1.0}




# -- files ---------------------------------------------------------------------------------------

_EXPECTED = ("expected fields 'question' and 'answer' (GSM8K, answer ending '#### 42') or "
             "'problem' and 'solution' (MATH, solution containing \\boxed{...})")


def last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def _finite_truth(truth: str) -> bool:
    """False for a ground truth that is a non-finite number: one `float()` reads as NaN or infinity ("nan", "inf",
    "1e400"), or whose last number overflows a float (scoring compares floats of it). LaTeX such as "\\infty" is
    text, compared as text."""
    number = parse_number(truth)
    return not non_finite(truth, text=True) and (number is None or math.isfinite(number))


def _record_to_row(record: Any, where: str, index: int, split: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a row must be a JSON object; {_EXPECTED}")
    if isinstance(record.get("question"), str) and isinstance(record.get("answer"), str):
        if "####" not in record["answer"]:
            raise ValueError(f"{where}: GSM8K-style 'answer' has no '#### <number>' line; {_EXPECTED}")
        truth = record["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        return make_row("gsm8k", record["question"], truth, split=split, index=index, system=SYSTEM_PROMPT)
    if isinstance(record.get("problem"), str) and isinstance(record.get("solution"), str):
        truth = last_boxed(record["solution"])
        truth = truth if truth is not None else record.get("answer")
        if not isinstance(truth, str) or not truth:
            raise ValueError(f"{where}: MATH-style 'solution' has no \\boxed{{...}} answer; {_EXPECTED}")
        return make_row("math", record["problem"], truth, split=split, index=index, system=SYSTEM_PROMPT)
    keys = sorted(record)[:10]
    raise ValueError(f"{where}: {_EXPECTED}; got fields {keys}")


def load_math_file(path: str | Path, split: str = "test") -> list[dict[str, Any]]:
    """verl-layout rows from a GSM8K- or MATH-style file: JSONL (one object per line), a `.json` array, or parquet."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet  # noqa: F401 (parquet_records reads with it)
        except ImportError as err:
            raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from err
        try:
            table = parquet_records(path)  # its errors name the file
        except ValueError as err:
            raise ValueError(f"{err}; {_EXPECTED}") from None
        records = [(f"{path}: row {i + 1}", r) for i, r in enumerate(table)]
    elif path.suffix == ".json" and read_utf8(path).lstrip().startswith("["):
        try:
            items = json.loads(read_utf8(path))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {err.lineno}: not valid JSON ({err.msg}); {_EXPECTED}") from None
        except RecursionError:
            raise ValueError(f"{path}: nested deeper than Python's JSON parser reads; {_EXPECTED}") from None
        records = [(f"{path}: item {i + 1}", r) for i, r in enumerate(items)]
    else:
        records = []
        for number, line in enumerate(read_utf8(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append((f"{path}: line {number}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {number}: not valid JSON ({err.msg}); {_EXPECTED}") from None
            except RecursionError:
                raise ValueError(f"{path}: line {number}: nested deeper than Python's JSON parser reads; "
                                 f"{_EXPECTED}") from None
    if not records:
        raise ValueError(f"{path}: no rows; {_EXPECTED}")
    rows = [check_row(_record_to_row(record, where, i, split), where) for i, (where, record) in enumerate(records)]
    for (where, _), row in zip(records, rows):
        if not _finite_truth(row["reward_model"]["ground_truth"]):
            raise ValueError(f"{where}: the answer {row['reward_model']['ground_truth'][:40]!r} is not a finite "
                             "number (NaN, infinity, or past a float's range); fix the answer or drop the row")
    return rows
