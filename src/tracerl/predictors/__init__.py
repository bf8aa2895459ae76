"""Neural success predictors (torch), named in `tracerl.core.predictor.PREDICTORS` and imported on first use.

* `EncoderHeadPredictor` ("minilm_head"): an MLP head over frozen all-MiniLM-L6-v2 sentence embeddings of the
  history text plus the numpy model's structural features.
* `LMValuePredictor` ("lm_value"): a value head on a causal LM's last hidden state (frozen base by default).

Both follow the `Predictor` interface of `tracerl.core.predictor`, so `make_predictor("minilm_head")` builds one
(the core names them as "module:attr" strings and never imports torch itself); deliberately not here: anything that
is not a predictor (see docs/predictors.md for when to use which).
"""

from __future__ import annotations

from tracerl.predictors.encoder_head import EncoderHeadPredictor, SentenceEncoder, minilm_path
from tracerl.predictors.head import EmbeddingHeadPredictor
from tracerl.predictors.lm_value import LMValuePredictor

__all__ = ["EmbeddingHeadPredictor", "EncoderHeadPredictor", "LMValuePredictor", "SentenceEncoder", "minilm_path"]
