"""The warm launcher server of `tracerl.io.sandbox`, and the messages between it and the calling process.

`serve` runs in a launcher started once per calling process (`child.py --serve`): for each call it forks a
launcher, which leaves `serve` in the state of a launcher freshly started for that call alone (`become_launcher`)
and goes on to apply every layer itself. Before forking it lets the launcher build what depends only on the call's
config (`prepare`: the seccomp filter), so that each fork inherits it ready instead of building it on the call's
path. The server never runs model code and holds nothing of a call but its request (paths, limits, the config's
tables); each fork is one call's and serves no other.

Like `child.py` it is stdlib only and valid Python 3.8: the launcher may run under a system python that
cannot import tracerl, so `tracerl.io.sandbox` hands it this file's text, which the launcher registers under this
module's name before it runs. Nothing here applies a layer.
"""

import json
import os
import sys
import time


def read_message(fd):
    """One length-prefixed JSON message from `fd` (os.read only: no Python buffer is left for a fork to inherit);
    None at end of file."""
    head = b""
    while len(head) < 4:
        chunk = os.read(fd, 4 - len(head))
        if not chunk:
            return None
        head += chunk
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        chunk = os.read(fd, size - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body)


def write_message(fd, message):
    data = json.dumps(message).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def serve(caller, launcher_modules, prepare):
    """Answer the caller's requests on stdin with replies on stdout, until it closes the pipe or is gone (checked
    every second). "launch" forks a launcher for one call and replies with its pid; the fork returns from here with
    the call's config (`become_launcher`). "reap" waits for a launcher the caller has seen end and replies with its
    wait status; "forget" does the same without a reply, for a launcher whose call the caller has already finished
    (it sends no signal to that group again). Either way a pid is never reused before the caller's last signal to
    its group. `prepare(config)` runs before each fork; `launcher_modules` are the modules a fresh launcher has."""
    import select  # the forked launchers drop it again (`launcher_modules`)
    while True:
        if not select.select([0], [], [], 1.0)[0]:
            if os.getppid() != caller:
                os._exit(0)
            continue
        request = read_message(0)
        if request is None:
            os._exit(0)
        if request["op"] in ("reap", "forget"):
            status = os.waitpid(request["pid"], 0)[1]
            if request["op"] == "reap":
                write_message(1, {"status": status})
            continue
        files = []
        try:
            for path, flags in zip(request["files"], (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY, os.O_WRONLY)):
                files.append(os.open(path, flags))
        except OSError as exc:
            for fd in files:
                os.close(fd)
            write_message(1, {"error": "could not open the call's files: %s" % exc})
            continue
        prepare(request["cfg"])
        pid = os.fork()
        if pid == 0:
            return become_launcher(request, files, launcher_modules)
        for fd in files:
            os.close(fd)
        write_message(1, {"pid": pid})


def become_launcher(request, files, launcher_modules):
    """In the fork: the state of a launcher started for this call alone (a session of its own; stdin, stdout, stderr
    and the status fd the call's files, no other descriptor; the call's workdir and environment; no module the
    server imported after the launcher's own), then its config, with the times it forked and got there."""
    forked = time.monotonic()
    os.setsid()
    for target, fd in zip((0, 1, 2), files[:3]):
        os.dup2(fd, target)
    status = files[3]
    for name in os.listdir("/proc/self/fd"):  # everything else the server held: its pipes, the files' first fds
        if int(name) > 2 and int(name) != status:
            try:
                os.close(int(name))
            except OSError:
                pass  # the listing's own fd, closed already
    os.chdir(request["cfg"]["workdir"])
    os.environ.clear()
    os.environ.update(request["env"])
    for name in set(sys.modules) - launcher_modules:
        del sys.modules[name]
    return dict(request["cfg"], status_fd=status, clock=[["launcher", forked], ["detached", time.monotonic()]])
