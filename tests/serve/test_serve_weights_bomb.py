"""`POST /v1/load_weights` bounds what a torch file can become in memory before anything is inflated: a torch file is
a zip, and a zip of about 1 MB (under the file-size bound) can declare, or only hold, over a gigabyte. Each bomb
here is refused with HTTP 400, the served weights stay as they were, and the server's peak memory (its high-water
mark, reset before each load) grows by far less than the bomb would take inflated."""

import re
import struct
import zlib
from functools import cache

import httpx
import pytest
import torch

from raw_http import HANG_S
from serve_support import guarded_server

BOMB_BYTES = 1126 << 20  # 1.18 GB of zeros, about 1.1 MB deflated: under the tiny model's 2 MB file bound
GROWTH_ALLOWED = 256 << 20  # peak memory a refused load may add: the bound is 2 MB, the bomb over 1 GB


@pytest.fixture(scope="module")
def served(model_dir):
    from tracerl.serve import ServeLimits, create_app, load_model

    engine, tokenizer, name = load_model(str(model_dir))
    limits = ServeLimits()
    with guarded_server(create_app(engine, name, tokenizer, limits), limits) as url:
        yield url, engine


@cache
def deflated_zeros(size: int) -> tuple[bytes, int]:
    """A raw deflate stream of `size` zero bytes (a multiple of 1 MiB) and their CRC-32, built in a second: after
    a full flush the compressor starts afresh, so each MiB deflates to the same bytes."""
    mib = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(mib) + compressor.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(mib, crc)
    return block * (size >> 20) + compressor.flush(), crc


STORED, DEFLATED = 0, 8


def entry(name: str, data: bytes, method: int = STORED, crc: int | None = None, size: int | None = None) -> tuple:
    """One zip entry: `data` as written (stored, or already deflated), with the CRC and uncompressed size that the
    headers declare (a bomb may declare a size its data does not have)."""
    return name, data, method, zlib.crc32(data) if crc is None else crc, len(data) if size is None else size


def write_zip(path, entries: list[tuple]) -> None:
    """A zip by hand: local headers, data, central directory, end record, with exactly the sizes given."""
    out, central = bytearray(), bytearray()
    for name, data, method, crc, size in entries:
        raw = name.encode()
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(data), size, len(raw), 0)
        out += raw + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, len(data), size,
                               len(raw), 0, 0, 0, 0, 0, offset)
        central += raw
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + end))


def torch_entries(engine, tmp_path) -> list[tuple]:
    """The entries of a torch.save of the served weights plus one (so a load that succeeds shows)."""
    import zipfile

    state = {k: v.clone() + 1.0 for k, v in engine.model.state_dict().items()}
    torch.save(state, tmp_path / "plain.pt")
    with zipfile.ZipFile(tmp_path / "plain.pt") as archive:
        return [entry(info.filename, archive.read(info)) for info in archive.infolist()]


def replaced(entries: list[tuple], suffix: str, new: tuple) -> list[tuple]:
    return [new if e[0].endswith(suffix) else e for e in entries]


def first_storage(entries: list[tuple]) -> str:
    return next(e[0] for e in entries if "/data/" in e[0] and not e[0].endswith("serialization_id"))


def bomb(kind: str, entries: list[tuple]) -> list[tuple]:
    stream, crc = deflated_zeros(BOMB_BYTES)
    pickle = next(e for e in entries if e[0].endswith("data.pkl"))
    storage = next(e for e in entries if e[0] == first_storage(entries))
    if kind == "storage declared":  # a tensor's storage inflates to 1.18 GB, and says so
        return replaced(entries, storage[0], entry(storage[0], stream, DEFLATED, crc, BOMB_BYTES))
    if kind == "storage lying":  # says it holds its true size, inflates to 1.18 GB
        return replaced(entries, storage[0], entry(storage[0], stream, DEFLATED, storage[3], storage[4]))
    if kind == "pickle declared":  # the pickle, read whole before any tensor, followed by 1.18 GB of zeros
        data = zlib.compressobj(9, zlib.DEFLATED, -15)
        head = data.compress(pickle[1]) + data.flush(zlib.Z_FULL_FLUSH)
        crc = zlib.crc32(pickle[1])
        for _ in range(BOMB_BYTES >> 20):
            crc = zlib.crc32(bytes(1 << 20), crc)
        return replaced(entries, "data.pkl", entry(pickle[0], head + stream, DEFLATED, crc,
                                                   len(pickle[1]) + BOMB_BYTES))
    if kind == "pickle lying":
        return replaced(entries, "data.pkl", entry(pickle[0], stream, DEFLATED, pickle[3], pickle[4]))
    if kind == "many entries":  # 12 extra entries of 100 MiB each: each under a gigabyte, the sum over it
        extra_stream, extra_crc = deflated_zeros(100 << 20)
        prefix = pickle[0].rsplit("/", 1)[0]
        return entries + [entry(f"{prefix}/extra/{i}", extra_stream, DEFLATED, extra_crc, 100 << 20)
                          for i in range(12)]
    raise AssertionError(kind)


def peak_rss_bytes() -> int:
    return int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) << 10


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets the high-water mark to the current RSS (the server runs in this
    process, in a thread)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def loads_then_restore(url, engine, path, tmp_path, before):
    """`path` loads (its weights are `before` + 1, as `torch_entries` writes them); the served weights are then put
    back to `before`."""
    try:
        response = httpx.post(f"{url}/v1/load_weights", json={"path": str(path)}, timeout=HANG_S)
        assert response.status_code == 200, response.text[:300]
        name = next(iter(before))
        assert torch.equal(engine.model.state_dict()[name], before[name] + 1.0)
    finally:
        torch.save(before, tmp_path / "orig.pt")
        restore = httpx.post(f"{url}/v1/load_weights", json={"path": str(tmp_path / "orig.pt")}, timeout=HANG_S)
        assert restore.status_code == 200, restore.text[:300]


def test_rebuilt_torch_file_loads(served, tmp_path):
    """The control: the entries of a torch.save, written again by `write_zip`, load; so a bomb's refusal below is
    its bomb's, not the rebuilding's."""
    url, engine = served
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    path = tmp_path / "rebuilt.pt"
    write_zip(path, torch_entries(engine, tmp_path))
    loads_then_restore(url, engine, path, tmp_path, before)


@pytest.mark.parametrize("kind", ["storage declared", "storage lying", "pickle declared", "pickle lying",
                                  "many entries"])
def test_zip_bomb_under_the_file_bound_is_refused_before_it_inflates(served, tmp_path, kind):
    from tracerl.serve.weights import max_file_bytes

    url, engine = served
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    path = tmp_path / f"{kind.replace(' ', '-')}.pt"
    write_zip(path, bomb(kind, torch_entries(engine, tmp_path)))
    assert path.stat().st_size < max_file_bytes(before), "the bomb is over the file bound: it tests nothing here"
    reset_peak_rss()
    start = peak_rss_bytes()
    response = httpx.post(f"{url}/v1/load_weights", json={"path": str(path)}, timeout=HANG_S)
    grew = peak_rss_bytes() - start
    assert response.status_code == 400, \
        f"{kind}: HTTP {response.status_code} after {grew / 2**20:.0f} MiB more at the peak: {response.text[:300]}"
    assert grew < GROWTH_ALLOWED, f"{kind}: the refused load took {grew / 2**20:.0f} MiB more memory at its peak"
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), f"{kind}: a refused load changed the weights"


def deflated(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def test_honestly_deflated_pickle_loads(served, tmp_path):
    """A zip that deflates what torch reads whole (its pickle), and says how large it is, is no bomb: it loads."""
    url, engine = served
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    entries = torch_entries(engine, tmp_path)
    pickle = next(e for e in entries if e[0].endswith("data.pkl"))
    path = tmp_path / "deflated-pickle.pt"
    write_zip(path, replaced(entries, "data.pkl", entry(pickle[0], deflated(pickle[1]), DEFLATED, pickle[3],
                                                        pickle[4])))
    loads_then_restore(url, engine, path, tmp_path, before)


def test_archive_problem_passes_what_torch_save_writes_and_refuses_the_rest(tmp_path):
    from tracerl.serve.weights import archive_problem

    state = {"w": torch.arange(1000, dtype=torch.float32)}
    torch.save(state, tmp_path / "saved.pt")
    assert archive_problem(tmp_path / "saved.pt", 1 << 20) == ""
    assert "declare" in archive_problem(tmp_path / "saved.pt", 1000)  # its entries hold over 4,000 bytes

    data = b"x" * 5000
    cases = {
        "a comment after the directory": lambda p: (write_zip(p, [entry("a/b", data)]),
                                                    p.write_bytes(p.read_bytes()[:-2] + b"\x04\x00abcd")),
        "bzip2": lambda p: write_zip(p, [entry("a/b", data, 12)]),
        "inflates to less than it declares": lambda p: write_zip(p, [entry("a/b", deflated(data), DEFLATED,
                                                                           zlib.crc32(data), 6000)]),
        "stored, declaring more than it holds": lambda p: write_zip(p, [entry("a/b", data, STORED, None, 6000)]),
        "not a zip": lambda p: p.write_bytes(b"\x80\x02}q\x00."),  # a pickle, torch's legacy format
    }
    for name, make in cases.items():
        path = tmp_path / "case.pt"
        make(path)
        assert archive_problem(path, 1 << 20), f"{name}: passed"
