"""The layers of docs/design.md (section 4): every package imports only its own layer and those below it, checked on
the source (an AST walk over every module, imports inside functions included), and core and io import without
torch."""

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


def test_every_package_imports_only_its_layer_and_below():
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
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_the_walk_sees_imports_inside_functions(tmp_path):
    probe = SRC / "core" / "_layer_probe.py"
    probe.write_text("def f():\n    from tracerl.train import trainer\n")
    try:
        assert "tracerl.train" in imports(probe)
        problems = [t for t in imports(probe) if t.startswith("tracerl.") and rank(t) > rank(module_name(probe))]
        assert problems == ["tracerl.train"]
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
    # transformers is allowed inside functions: io/tokenizer.py loads a (torch-free) fast tokenizer with it
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
