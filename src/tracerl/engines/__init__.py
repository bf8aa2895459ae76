"""Heavy-layer generation engines (torch): the transformers engine with KV reuse across branches, tiny models."""


from contextlib import contextmanager


@contextmanager
def torch_threads(num_threads: int):
    """Run the block with `num_threads` torch CPU threads (0 = leave as is), then restore the old count.

    Tiny models on a busy 2-core machine run several times faster on one thread than on two (OpenMP)."""
    import torch

    before = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
