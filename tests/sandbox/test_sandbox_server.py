"""The warm launcher server: a call's launcher forked from it must be the launcher a fresh interpreter would be, and
the code must not reach the server (its pipes, its signals) or share state with another call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tracerl.io import sandbox
from tracerl.io.sandbox import run_python

pytestmark = pytest.mark.skipif(not sandbox._pidfds(), reason="the launcher server needs pidfds (Linux >= 5.3)")

# what the code sees of its process (but its workdir's name and its uid, which are the call's own): any difference
# between a forked launcher and a fresh one shows here
STATE = textwrap.dedent("""\
    import os, resource, sys
    print(sorted(sys.modules))
    print([(k, v.replace(os.getcwd(), "WORKDIR")) for k, v in os.environ.items()])
    print(os.getcwd() == os.environ["HOME"], sys.argv, sys.path, sys.flags)
    print(sorted(os.listdir("/proc/self/fd")))
    print({"alpha", "beta", "gamma", "delta", "epsilon"})
    print(os.getuid() == os.getgid(), os.getuid() >= 2_000_000_000, os.getgroups(), os.getpid(),
          os.getsid(0) == os.getpid())
    print([resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC,
                                          resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)])
    """)


def server_pid() -> int:
    return sandbox._LaunchServer.get(sandbox._interpreter(drop=os.geteuid() == 0)).proc.pid


def test_a_forked_launcher_is_a_fresh_one():
    served, fresh = run_python(STATE), run_python(STATE, _fresh=True)
    assert served.ok and fresh.ok, (served, fresh)
    if "pidns" not in served.layers:  # the pid and session differ between any two calls outside a PID namespace
        pytest.skip("without a PID namespace the pids differ")
    assert served.stdout == fresh.stdout
    assert served.layers == fresh.layers


def test_the_code_holds_no_descriptor_of_the_server():
    """A launch request written to the server's pipe would choose the layers: no fd of the code may reach it."""
    pid = server_pid()
    code = textwrap.dedent(f"""\
        import json, os
        request = json.dumps({{"op": "launch", "cfg": {{}}, "env": {{}}, "files": []}}).encode()
        reached = []
        for fd in range(3, 1024):
            try:
                os.write(fd, len(request).to_bytes(4, "big") + request)
                reached.append(fd)
            except OSError:
                pass
        for name in ("0", "1"):
            try:
                os.close(os.open("/proc/{pid}/fd/" + name, os.O_WRONLY))
                reached.append("/proc/{pid}/fd/" + name)
            except OSError:
                pass
        print(reached)
        """)
    result = run_python(code)
    assert result.stdout.strip() == "[]", result
    assert server_pid() == pid and run_python("print(6 * 7)").stdout == "42\n"  # the same server, still serving


@pytest.mark.parametrize("how", ["os.kill({pid}, 9)", "os.killpg({pid}, 9)", "os.kill(os.getppid(), 9)"])
def test_the_code_cannot_signal_the_server(how):
    pid = server_pid()
    result = run_python(f"import os\n{how.format(pid=pid)}\n")
    assert not result.ok
    # a call through the server first: a server that got the signal (however late it dies on a loaded machine)
    # fails this call or is replaced by it, and the pid below changes
    assert run_python("print('alive')").stdout == "alive\n"
    assert server_pid() == pid, "the server was replaced: the code killed it"


def test_calls_do_not_share_random_state():
    code = "import os, random\nprint(random.random(), os.urandom(8).hex())"
    outputs = {run_python(code).stdout for _ in range(3)}
    assert len(outputs) == 3, outputs


def test_a_killed_server_is_replaced():
    first = server_pid()
    os.kill(first, signal.SIGKILL)
    os.waitpid(first, 0)
    assert run_python("print('again')").stdout == "again\n"
    assert server_pid() != first


def test_calls_from_many_threads_get_their_own_outputs():
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: run_python(f"print({i} * {i})"), range(32)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(32)]


def test_the_server_ends_with_its_caller():
    code = textwrap.dedent("""\
        import os
        from tracerl.io import sandbox
        assert sandbox.run_python("print(1)").stdout == "1\\n"
        server = sandbox._LaunchServer.get(sandbox._interpreter(drop=os.geteuid() == 0)).proc
        print(server.pid, flush=True)
        os._exit(0)  # no cleanup: the server must notice on its own
        """)
    pid = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    deadline = time.monotonic() + 60  # the server looks for its caller once a second
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"timeout: the launcher server {pid} outlived its caller by 60 s")


def test_a_launcher_killed_before_its_setsid_still_dies():
    """A timeout (or ^C) can come between the server's fork and the launcher's setsid: no group by its pid yet."""
    proc = subprocess.Popen(["sleep", "60"])  # in this process's group, like a fork before its setsid
    try:
        sandbox._kill_group(proc.pid)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_a_forked_caller_gets_its_own_server():
    """A thread of the parent may hold the server registry's lock when the process forks (a multiprocessing worker,
    a data loader): the child must still run code, through a server of its own."""
    code = textwrap.dedent("""\
        import os, signal
        from tracerl.io import sandbox
        assert sandbox.run_python("print(1)").stdout == "1\\n"
        sandbox._LaunchServer._registry_lock.acquire()  # as if another thread held it at the fork
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)  # a child that deadlocks dies by itself instead of outliving the test
            os._exit(0 if sandbox.run_python("print(5)").stdout == "5\\n" else 1)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "0", done.stderr[-2000:]
