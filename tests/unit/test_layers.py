"""The layers of docs/design.md (section 4): every package imports only its own layer and those below it, checked on
the source (an AST walk over every module, imports inside functions included), and core and io import without
torch; inside io, each room imports only itself and the rooms below it. Also the rooms of the step: no import circle,
nothing registered into a tracerl registry on import, and no module but core/ledger.py reads what a rollout costs."""

import ast
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "tracerl"
HEAVY = ("torch", "transformers", "vllm", "ray", "requests", "httpx", "aiohttp", "socket", "subprocess")

# package (or top-level module) -> rank: a module may import tracerl modules of its own rank or below
RANKS = {
    "core": 0,  # stdlib + numpy: the algorithm
    "io": 1,  # no torch: engines' protocol, environments, driver, config, logs
    "engines": 2, "predictors": 2,  # heavy parts that know nothing of training
    "policy": 3, "executors": 3, "serve": 3,  # policies we build, rollout workers, the generation server
    "report": 4,  # reads run directories (the trainer writes its report at the end)
    "train": 5,
    "bench": 6, "integrations": 6,
    "cli": 7, "__init__": 7,
}
# io's rooms (docs/design.md, section 4) -> rank inside io: a module of io may import io modules of its own room's rank
# or below. files and the sandbox stand on nothing else in io; env on files; domains and rollout on env (and below).
IO_ROOMS = {"files": 0, "sandbox": 0, "env": 1, "domains": 2, "rollout": 2}
# (importing module, imported module prefix) pairs allowed against the ranks, each with its reason (none today:
# `tracerl compare` trains in tracerl.train.compare, and tracerl.report.compare only reads run directories)
EXEMPT: dict[tuple[str, str], str] = {}


def modules(layer: str) -> list[str]:
    return [".".join(("tracerl",) + p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
            for p in sorted((SRC / layer).rglob("*.py"))]


def module_name(path: pathlib.Path) -> str:
    return ".".join(("tracerl",) + path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def imports(path: pathlib.Path) -> list[str]:
    """Every module `path` imports, at any depth (functions, methods, try blocks), relative imports resolved."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            out.append(base)
    return out


def rank(module: str) -> int:
    top = module.split(".")[1] if module.count(".") else "__init__"
    assert top in RANKS, f"{module}: package {top!r} has no layer; add it to RANKS in tests/unit/test_layers.py"
    return RANKS[top]


def io_room(module: str) -> int:
    """The rank of an io module's room (`tracerl.io` itself, the package's docstring, ranks above them all)."""
    parts = module.split(".")
    if len(parts) < 3:
        return max(IO_ROOMS.values()) + 1
    assert parts[2] in IO_ROOMS, f"{module}: io room {parts[2]!r} has no rank; add it to IO_ROOMS in test_layers.py"
    return IO_ROOMS[parts[2]]


def upward_imports() -> list[str]:
    """Every import against the layers, or, inside io, against its rooms (none is exempt from the rooms)."""
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        source = module_name(path)
        for target in imports(path):
            if not target.startswith("tracerl.") or target == "tracerl":
                continue
            if any(source == s and target.startswith(t) for s, t in EXEMPT):
                continue
            if rank(target) > rank(source):
                problems.append(f"{source} imports {target} (layer {rank(target)} above {rank(source)})")
            elif source.startswith("tracerl.io.") and target.startswith("tracerl.io.") \
                    and io_room(target) > io_room(source):
                problems.append(f"{source} imports {target} (io room {target.split('.')[2]} above "
                                f"{source.split('.')[2]})")
    return problems


def test_every_package_imports_only_its_layer_and_below():
    problems = upward_imports()
    assert not problems, "imports against the layers or io's rooms:\n" + "\n".join(problems)


def test_every_io_module_sits_in_a_room():
    loose = [m for m in modules("io") if m != "tracerl.io" and m.split(".")[2] not in IO_ROOMS]
    assert not loose, f"io modules outside a room: {loose}; put each in one of {sorted(IO_ROOMS)}"


def test_the_walk_sees_imports_inside_functions(tmp_path):
    probe = SRC / "core" / "_layer_probe.py"
    probe.write_text("def f():\n    from tracerl.train import trainer\n")
    try:
        assert "tracerl.train" in imports(probe)
        problems = [t for t in imports(probe) if t.startswith("tracerl.") and rank(t) > rank(module_name(probe))]
        assert problems == ["tracerl.train"]
    finally:
        probe.unlink()


def test_the_walk_sees_an_import_against_io_s_rooms():
    probe = SRC / "io" / "files" / "_room_probe.py"
    probe.write_text("def f():\n    from tracerl.io.rollout import driver\n")
    try:
        found = [p for p in upward_imports() if p.startswith("tracerl.io.files._room_probe ")]
        assert found == ["tracerl.io.files._room_probe imports tracerl.io.rollout (io room rollout above files)"], found
    finally:
        probe.unlink()


def test_lower_layers_import_with_torch_blocked():
    blocker = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        f"    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {('torch', 'transformers', 'vllm', 'ray')!r}:\n"
        "            raise ImportError('blocked heavy import: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    names = modules("core") + modules("io")
    code = blocker + "".join(f"import {name}\n" for name in names) + "print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_io_never_imports_torch_even_inside_functions():
    # transformers is allowed inside functions: io/rollout/tokenizer.py loads a (torch-free) fast tokenizer with it
    for path in (SRC / "io").rglob("*.py"):
        for name in imports(path):
            assert name.split(".")[0] not in ("torch", "vllm"), f"{path.name} imports {name}"


def test_core_imports_only_stdlib_numpy_and_core():
    allowed_stdlib = set(sys.stdlib_module_names) - set(HEAVY) - {"io", "os", "pathlib", "shutil", "tempfile"}
    for path in (SRC / "core").rglob("*.py"):
        for name in imports(path):
            top = name.split(".")[0]
            ok = top in allowed_stdlib or top == "numpy" or name.startswith("tracerl.core") or top == "__future__"
            assert ok, f"{path.name} imports {name}: core may use only the stdlib (no I/O), numpy and tracerl.core"


def _module_graph() -> dict[str, set[str]]:
    """module -> the tracerl modules it imports (any depth; `from a.b import c` counts a.b.c when it is a module)."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}

    def resolve(target: str) -> str | None:
        parts = target.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph = {m: set() for m in modules}
    for m, path in modules.items():
        for target in imports(path):
            found = resolve(target) if target.startswith("tracerl.") else None
            if found and found != m:
                graph[m].add(found)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]], "the cycle finder"
    circles = _cycles(_module_graph())
    assert not circles, f"modules that import each other (at any depth): {circles}; move what both need below them"


def _import_time_statements(body: list[ast.stmt]):
    """The statements that run when a module is imported: its body, into loops, ifs, withs and tries, but not
    into functions or classes."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from _import_time_statements(getattr(node, field, []) or [])
        for handler in getattr(node, "handlers", []) or []:
            yield from _import_time_statements(handler.body)


def test_nothing_registers_into_a_tracerl_registry_on_import():
    """A registry (an upper-case dict) is filled where it is defined, or names its entries as "module:attr"
    strings (predictors, domains): no module writes into another module's registry at import."""
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("tracerl") for alias in node.names}
        for node in _import_time_statements(tree.body):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                        and target.value.id in imported:
                    problems.append(f"{module_name(path)}:{node.lineno} writes into {target.value.id}")
            call = node.value if isinstance(node, ast.Expr) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in imported \
                    and call.func.id.startswith("register"):
                problems.append(f"{module_name(path)}:{node.lineno} calls {call.func.id}")
    assert not problems, "registration on import:\n" + "\n".join(problems)


def test_only_the_ledger_reads_what_a_rollout_costs():
    """`continuation_cost` and `budget_unit` are read in core/ledger.py only (the prices); other modules ask it."""
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "core" / "ledger.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("continuation_cost", "budget_unit"):
                problems.append(f"{module_name(path)}:{node.lineno} reads .{node.attr}")
    assert not problems, "prices read outside tracerl.core.ledger:\n" + "\n".join(problems)
