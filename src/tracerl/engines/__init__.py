"""Heavy-layer generation engines (torch): the transformers engine with KV reuse across branches, tiny models."""
