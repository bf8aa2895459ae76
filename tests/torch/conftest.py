import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """OpenMP with 2 threads on tiny shapes is up to 10x slower on a busy 2-core machine."""
    from tracerl.engines import torch_threads

    with torch_threads(1):
        yield
