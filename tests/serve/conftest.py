import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from helpers import BUILD_SEED
from serve_support import VOCAB


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """OpenMP with 2 threads on tiny shapes is up to 10x slower on a busy 2-core machine."""
    from tracerl.engines import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def model():
    from tracerl.engines.tiny import tiny_qwen3

    return tiny_qwen3(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=BUILD_SEED)


@pytest.fixture(scope="session")
def model_dir(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def server(model_dir):
    """`tracerl serve`'s app over the saved tiny model, loaded the way the CLI loads it, in a uvicorn thread."""
    from serve_support import thread_server

    from tracerl.serve import create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    with thread_server(create_app(engine, name, tokenizer)) as url:
        yield url
