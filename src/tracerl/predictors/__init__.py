"""Neural success predictors (torch): importing this package registers them in `tracerl.core.predictor.PREDICTORS`.

* `EncoderHeadPredictor` ("minilm_head"): an MLP head over frozen all-MiniLM-L6-v2 sentence embeddings of the
  history text plus the numpy model's structural features.
* `LMValuePredictor` ("lm_value"): a value head on a causal LM's last hidden state (frozen base by default).

Both follow the `Predictor` interface of `tracerl.core.predictor`, so `make_predictor("minilm_head")` works once
this package is imported. The core never imports this package (it must stay free of torch); deliberately not
here: anything that is not a predictor (see docs/predictors.md for when to use which).
"""

from __future__ import annotations

from tracerl.core.predictor import PREDICTORS
from tracerl.predictors.encoder_head import EncoderHeadPredictor, SentenceEncoder, minilm_path
from tracerl.predictors.head import EmbeddingHeadPredictor
from tracerl.predictors.lm_value import LMValuePredictor

PREDICTORS[EncoderHeadPredictor.name] = EncoderHeadPredictor
PREDICTORS[LMValuePredictor.name] = LMValuePredictor

__all__ = ["EmbeddingHeadPredictor", "EncoderHeadPredictor", "LMValuePredictor", "SentenceEncoder", "minilm_path"]
