"""Fixtures for the verl integration tests: loopback-only Ray, a real TransferQueue, a tiny model directory.

The test modules skip themselves without verl (the main environment never has it: verl pins transformers < 5.11);
run them in `.venv-verl` with `.ci/verl` or `python -m pytest -q tests/verl -m verl`. This file imports nothing
from verl at module level, so collecting it in the main environment is harmless.
"""

import os

import pytest


def listeners() -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of this process and its children (Ray's processes)."""
    import psutil  # a Ray and verl dependency

    me = psutil.Process()
    pids = {me.pid} | {c.pid for c in me.children(recursive=True)}
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}

def pytest_collection_modifyitems(items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.verl)


@pytest.fixture(scope="session")
def cluster():
    """A loopback-only local Ray cluster (tracerl's `start_ray`), then TransferQueue with one storage unit.

    `ray.init(_node_ip_address="127.0.0.1")` alone is not enough: Ray's core workers then still listen on the
    wildcard address and TransferQueue binds its sockets to the machine's outward address; `start_ray` switches
    Ray's cluster mode off so the node, and everything bound to its address, is 127.0.0.1.
    Ray's CPUs are reservations, not cores: TransferQueue's controller and each storage unit hold one for their
    lifetime, and an actor needs one free to be placed (verl's agent-loop workers then hold none), so 3 logical
    CPUs on this 2-core machine; TransferQueue's default of 2 storage units would leave no room for a worker."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    from tracerl.executors import start_ray

    before = listeners()
    # the worker actors unpickle test-defined clients and tests/helpers.py's scripted expert: let them import both
    here = os.path.dirname(os.path.abspath(__file__))
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.path.dirname(here), saved or ""])
    try:
        start_ray(num_cpus=3)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        yield {"before": before, "listeners": listeners}
    finally:
        tq.close()
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Multihop rows, a tokenizer trained on them (tracerl's chat template), a random tiny Qwen3; saved to a
    directory verl's HFModelConfig loads (nothing is downloaded)."""
    from helpers import BUILD_SEED, make_renderer

    from tracerl.engines.tiny import tiny_qwen3
    from tracerl.io.domains.multihop import MultiHopDomain

    domain = MultiHopDomain()
    rows = domain.rows("train", 8, seed=0)
    renderer = make_renderer([r["prompt"][-1]["content"] for r in rows], vocab_size=600)
    model = tiny_qwen3(vocab_size=len(renderer.tokenizer), hidden_size=32, num_heads=2, num_kv_heads=1,
                       seed=BUILD_SEED)
    path = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(path)
    renderer.tokenizer.save_pretrained(path)
    return {"rows": rows, "renderer": renderer, "domain": domain, "model": model, "path": str(path)}


