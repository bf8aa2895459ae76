"""RayRolloutRunner against real pieces: a local Ray cluster on loopback, 2 worker actors, `tracerl serve`'s app over
a tiny embedded policy. What runs on the workers must equal what in-process ReActDrivers sample with the same
seeds, grow the caller's trees in place, and survive a killed or failing worker as failed leaves."""

import importlib.util
import ipaddress
import os
from pathlib import Path

import pytest

# tests/ is on sys.path (tests/conftest.py), where this folder would pass for a namespace package named ray
_spec = importlib.util.find_spec("ray")
if _spec is None or _spec.origin is None:
    pytest.skip("Ray is not installed: pip install -e \".[ray]\"", allow_module_level=True)

import ray  # noqa: E402

from tracerl.engines.openai_engine import OpenAIEngine  # noqa: E402
from tracerl.executors import RayRolloutRunner, partition, worker_seed  # noqa: E402
from tracerl.io.rollout.driver import ReActDriver  # noqa: E402
from tracerl.io.rollout.engine import SamplingParams  # noqa: E402

SEED = 7
COUNTS = [3, 2, 2, 1, 2]


# ------------------------------------------------------------------------------------------------ helpers

def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # the process ended meanwhile
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == pid and p not in out]
        out.update(kids)
        frontier.extend(kids)
    return out


def _decode(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc/net writes each 32-bit word in host (little-endian) order
    words = b"".join(raw[i: i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_addresses(pids: set[int]) -> list[tuple[str, int, int]]:
    """(local address, port, pid) of every TCP socket in LISTEN state owned by one of `pids` (Linux /proc)."""
    listening = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                hex_ip, hex_port = fields[1].split(":")
                listening[fields[9]] = (_decode(hex_ip), int(hex_port, 16))
    found = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            inode = target[len("socket:["):-1] if target.startswith("socket:[") else None
            if inode in listening:
                found.append((*listening[inode], pid))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def intermediate(tree) -> list[int]:
    return [n.node_id for n in tree.nodes[1:] if not n.is_leaf]


# ------------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def runner(ray_cluster, server_url, policy):
    with RayRolloutRunner(server_url, str(policy.path / "tokenizer"), policy.config.make_domain, num_workers=2,
                          model="tiny", sampling=SamplingParams(temperature=1.0, seed=SEED),
                          limits=policy.config.limits(), num_cpus_per_worker=0.5, call_timeout_s=120) as r:
        yield r


@pytest.fixture(scope="module")
def rows(policy):
    return policy.domain.rows("train", 6, seed=3)


# ------------------------------------------------------------------------------------------------ tests

def test_partition_balances_counts_and_keeps_order():
    shares = partition([3, 2, 2, 1, 2], 2)
    assert sorted(p for s in shares for p in s) == [0, 1, 2, 3, 4]
    loads = [sum([3, 2, 2, 1, 2][p] for p in s) for s in shares]
    assert max(loads) - min(loads) <= 1, loads
    assert all(s == sorted(s) for s in shares)
    assert partition([5], 3) == [[0], [], []]
    assert worker_seed(7, 0) == 7 and worker_seed(7, 1) != 7 and worker_seed(None, 1) is None


def test_local_cluster_listens_on_loopback_only(ray_cluster):
    assert ray_cluster["node_ip_address"] == "127.0.0.1", ray_cluster
    assert ray_cluster["gcs_address"].startswith("127.0.0.1:"), ray_cluster
    ray.get(ray.remote(lambda: 1).remote())  # a worker process is up and serving too
    sockets = listening_addresses(_descendants(os.getpid()))
    gcs_port = int(ray_cluster["gcs_address"].rsplit(":", 1)[1])
    assert gcs_port in {port for _, port, _ in sockets}, f"the GCS port {gcs_port} is not among {sockets}"
    assert len({pid for *_, pid in sockets}) >= 3, f"expected the GCS, the raylet and a worker listening: {sockets}"
    exposed = [s for s in sockets if not is_loopback(s[0])]
    assert not exposed, f"Ray processes listen beyond loopback: {exposed}"


def test_workers_sample_what_in_process_drivers_sample(runner, rows, server_url, policy):
    runner.counters.clear()
    histories = runner.set_rows(rows, seed=SEED)
    assert [h.prompt_id for h in histories] == [h.prompt_id for h in ReActDriver(
        None, policy.renderer, policy.domain).set_rows(rows)]
    indices = [0, 1, 2, 4, 5]
    trees, num_tokens = runner.run_roots(indices, COUNTS)
    assert [t.meta["pool_index"] for t in trees] == indices
    assert [len(t.leaves()) for t in trees] == COUNTS
    assert num_tokens > 0 and runner.counters["rollout/worker_errors"] == 0

    # the same shares on in-process drivers over the same server, each seeded as its worker
    shares = partition(COUNTS, 2)
    engine = OpenAIEngine(server_url, "tiny")
    drivers = [ReActDriver(engine, policy.renderer, policy.domain, limits=policy.config.limits(),
                           sampling=SamplingParams(temperature=1.0, seed=worker_seed(SEED, w))) for w in range(2)]
    expected = [None] * len(indices)
    expected_tokens = 0
    for driver, share in zip(drivers, shares):
        driver.set_rows(rows)
        got, tokens = driver.run_roots([indices[p] for p in share], [COUNTS[p] for p in share])
        expected_tokens += tokens
        for p, tree in zip(share, got):
            expected[p] = tree
    assert trees == expected, "bare rollouts on the workers differ from the in-process drivers'"
    assert num_tokens == expected_tokens

    # continuations: two from the first intermediate node of every tree, or from its root where it has none (whether
    # a rollout of this plumbing-grade policy lasts two turns depends on the weights a machine builds), a note set on
    # it by the caller
    requests = [(t, (intermediate(t) or [0])[0], 2) for t in trees]
    owner = {p: w for w, share in enumerate(shares) for p in share}
    assert {owner[trees.index(t)] for t, _, _ in requests} == {0, 1}, "both workers should get continuations"
    before = {id(t): (len(t), [t.prefix_token_ids(i) for i in range(len(t))]) for t in trees}
    for tree, node_id, _ in requests:
        tree.nodes[node_id].p_pred = 0.25
        expected[trees.index(tree)].nodes[node_id].p_pred = 0.25
    num_tokens = runner.run_continuations(requests)
    for w, driver in enumerate(drivers):
        driver.run_continuations([(expected[trees.index(t)], n, k) for t, n, k in requests
                                  if owner[trees.index(t)] == w])
    assert trees == expected, "continuations on the workers differ from the in-process drivers'"
    assert num_tokens > 0
    for tree, node_id, k in requests:
        num_before, prefixes = before[id(tree)]
        new = tree.nodes[num_before:]
        new_leaves = [n.node_id for n in new if n.is_leaf]
        assert len(new_leaves) == k and len(tree.leaves()) == COUNTS[trees.index(tree)] + k
        assert all(node_id in tree.path(i) for i in new_leaves), "a continuation leaf must descend from its anchor"
        assert [tree.prefix_token_ids(i) for i in range(num_before)] == prefixes, "existing prefixes changed"
        assert tree.nodes[node_id].p_pred == 0.25, "the caller's note on a node was lost"
        assert tree.children[node_id][-k:] == [n.node_id for n in new if n.parent_id == node_id][-k:]
    counted = sum((d.counters for d in drivers), start=type(runner.counters)())
    assert {k: v for k, v in runner.counters.items() if v} == {k: v for k, v in counted.items() if v}


def test_killed_worker_gives_failed_leaves_not_an_exception(runner, rows):
    runner.counters.clear()
    runner.set_rows(rows, seed=SEED + 1)
    trees, _ = runner.run_roots([0, 1, 2, 3], [2, 2, 2, 2])
    shares = partition([2, 2, 2, 2], 2)
    requests = [(t, intermediate(t)[0], 2) for t in trees if intermediate(t)]
    victim = 1
    ray.kill(runner.actors[victim])  # mid-step: after the bare rollouts, before stage 2
    runner.run_continuations(requests)
    for p, tree in enumerate(trees):
        for t, node_id, k in requests:
            if t is not tree:
                continue
            new = [tree.nodes[i] for i in tree.leaves_below(node_id)][-k:]
            reasons = {n.finish_reason for n in new}
            if p in shares[victim]:
                assert reasons == {"error"} and all(n.reward == 0.0 and not n.segment.token_ids for n in new)
            else:
                assert len(tree.leaves_below(node_id)) >= k and "rollout failed" not in \
                    " ".join(n.segment.observation_text for n in new)
    lost = sum(k for t, _, k in requests if trees.index(t) in shares[victim])
    assert runner.counters["rollout/worker_errors"] == 1
    assert runner.counters["rollout/worker_error_rollouts"] == lost
    # later in the same step the dead worker gets no prompts; the next step starts a replacement
    more, _ = runner.run_roots([4, 5], [2, 2])
    assert [len(t.leaves()) for t in more] == [2, 2] and not any("worker_error" in t.meta for t in more)
    assert runner.counters["rollout/worker_errors"] == 1
    runner.set_rows(rows)
    assert runner.counters["rollout/worker_restarts"] == 1 and not runner.dead
    trees, _ = runner.run_roots([0, 1], [1, 1])
    assert [len(t.leaves()) for t in trees] == [1, 1]


def test_failing_worker_gives_failed_trees(ray_cluster, policy, rows):
    closed = f"http://127.0.0.1:{_closed_port()}"
    with RayRolloutRunner(closed, str(policy.path / "tokenizer"), policy.config.make_domain, num_workers=1,
                          model="tiny", engine_options={"max_retries": 0, "timeout_s": 5},
                          num_cpus_per_worker=0.5) as runner:
        runner.set_rows(rows)
        trees, num_tokens = runner.run_roots([0, 3], [2, 3])
    assert num_tokens == 0 and [len(t.leaves()) for t in trees] == [2, 3]
    assert all(t.nodes[i].finish_reason == "error" and t.nodes[i].reward == 0.0 for t in trees for i in t.leaves())
    assert "EngineError" in trees[0].meta["worker_error"]
    assert runner.counters["rollout/worker_errors"] == 1 and runner.counters["rollout/worker_error_rollouts"] == 5


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
