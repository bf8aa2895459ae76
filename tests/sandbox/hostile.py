"""Hostile programs for the hardening suite, shared by the root tests and the non-root run (`nonroot_probe.py`).
{dir} is a directory outside the sandbox that must stay untouched, {pid} a process outside it that must survive."""

HARDENING = {
    # a child in a new session: the process-group kill does not reach it; it would keep writing after the call
    "session_escape": (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        "    while True:\n"
        "        open('still-here-%d' % time.monotonic_ns(), 'w').close()\n"
        "        time.sleep(0.05)\n"
        "time.sleep(30)\n"
    ),
    "exec_shell": "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo pwned-by-shell'])\n",
    "kill_host": "import os\nos.kill({pid}, 9)\n",
    "write_outside": "open({dir!r} + '/pwned.txt', 'w').write('pwned')\n",
    "read_outside": "print(open({dir!r} + '/secret.txt').read())\n",
    "deep_tree": (
        "import os\n"
        "while True:\n"
        "    os.mkdir('d')\n"
        "    os.chdir('d')\n"
        "    open('f', 'w').close()\n"
    ),
    "disk_fill": (
        "i = 0\n"
        "while True:\n"
        "    with open('big%d' % i, 'wb') as f:\n"
        "        f.write(b'x' * (7 << 20))\n"
        "    i += 1\n"
    ),
    "forked_memory": (
        "import os, time\n"
        "for _ in range(4):\n"
        "    if os.fork() == 0:\n"
        "        x = bytearray(400 << 20)\n"
        "        time.sleep(30)\n"
        "time.sleep(30)\n"
    ),
}
