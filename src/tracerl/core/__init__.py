"""Core layer: pure Python + numpy. No torch, no tokenizer, no files, no sockets (docs/design.md, section 4)."""
