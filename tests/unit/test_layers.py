"""DESIGN.md section 4: core and io import without torch; core imports only stdlib, numpy and itself."""

import ast
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "tracerl"
HEAVY = ("torch", "transformers", "vllm", "ray", "requests", "httpx", "aiohttp", "socket", "subprocess")


def modules(layer: str) -> list[str]:
    return [".".join(("tracerl",) + p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
            for p in sorted((SRC / layer).rglob("*.py"))]


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


def test_core_imports_only_stdlib_numpy_and_core():
    allowed_stdlib = set(sys.stdlib_module_names) - set(HEAVY) - {"io", "os", "pathlib", "shutil", "tempfile"}
    for path in (SRC / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                ok = top in allowed_stdlib or top == "numpy" or name.startswith("tracerl.core") or top == "__future__"
                assert ok, f"{path.name} imports {name}: core may use only the stdlib (no I/O), numpy and tracerl.core"
