"""Core layer: pure Python + numpy. No torch, no tokenizer, no files, no sockets (DESIGN.md section 4)."""
