"""Programs for the rule that a sandboxed call inherits nothing from an earlier one, shared by the root tests
(`test_sandbox_fresh_calls.py`) and the non-root run (`carryover_probe.py`); stdlib only.

LEAVE changes everything of its own that a call can change and that a pooled, prepared or reused design could hand
on: files in its workdir, HOME and TMPDIR (one a module that would shadow the stdlib's), its environment, threads,
descriptors, signal dispositions, mask and timers, modules (the stdlib's and the launcher's own globals), and its
rlimits. Each program of LOOK prints, as one JSON line, what a call finds of one of these; run after LEAVE it must
print what it printed before LEAVE ran. Workdir paths and pipe numbers, which are each call's own, are printed as
WORKDIR and pipe."""

LEAVE = r"""
import builtins, json, math, os, resource, signal, sys, tempfile, threading, time
for folder in (os.getcwd(), os.environ["HOME"], os.environ["TMPDIR"], tempfile.gettempdir()):
    with open(os.path.join(folder, "left-behind.txt"), "w") as f:
        f.write("from an earlier call")
os.makedirs("sub/deeper", exist_ok=True)
open("sub/deeper/file", "w").close()
open(".hidden", "w").close()
tempfile.mkstemp()
with open("statistics.py", "w") as f:
    f.write("raise SystemExit('the stdlib was shadowed by a module an earlier call wrote')\n")
for path in ("/tmp/tracerl-left-behind", "/dev/shm/tracerl-left-behind"):
    try:
        open(path, "w").close()
    except OSError:
        pass
os.environ["LEFT_BEHIND"] = "1"
os.environ["PATH"] = os.getcwd()
os.putenv("LEFT_BEHIND_TOO", "1")
for _ in range(8):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
held = [os.open("left-behind.txt", os.O_RDONLY) for _ in range(12)]
held += list(os.pipe())
os.dup2(1, 40)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR1, lambda *args: None)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGHUP})
signal.setitimer(signal.ITIMER_REAL, 100.0)
math.sqrt = lambda x: -1.0
json.dumps = lambda *args, **kwargs: "patched by an earlier call"
sys.path.insert(0, os.getcwd())
sys.modules["fractions"] = None
launcher = sys._getframe(1).f_globals
for name, value in list(launcher.items()):
    if callable(value) and not isinstance(value, type):
        launcher[name] = lambda *args, **kwargs: None
launcher["LAUNCHER_MODULES"] = frozenset()
for which, value in ((resource.RLIMIT_NOFILE, 48), (resource.RLIMIT_CPU, 4), (resource.RLIMIT_FSIZE, 1 << 20),
                     (resource.RLIMIT_NPROC, 40), (resource.RLIMIT_AS, 400 << 20)):
    resource.setrlimit(which, (value, value))
builtins.len = lambda x: -1
builtins.print = lambda *args, **kwargs: None
"""

_HEAD = ("import json, os, sys\n"
         "show = lambda value: sys.stdout.write(json.dumps(value).replace(os.getcwd(), 'WORKDIR') + '\\n')\n")

LOOK = {
    "files": _HEAD + (
        "import tempfile\n"
        "listed = {name: sorted(os.listdir(path)) for name, path in (('cwd', '.'), ('home', os.environ['HOME']),\n"
        "          ('tmpdir', os.environ['TMPDIR']), ('tempfile', tempfile.gettempdir()))}\n"
        "listed['outside'] = [os.path.exists(p + 'tracerl-left-behind') for p in ('/tmp/', '/dev/shm/')]\n"
        "import statistics\n"
        "listed['statistics'] = (statistics.__file__.startswith(os.getcwd()), statistics.mean([1, 2]))\n"
        "show(listed)\n"
    ),
    "environment": _HEAD + "show(sorted(os.environ.items()))\n",
    "threads": _HEAD + (
        "import threading\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())\n"
        "show({'threads': status['Threads'].strip(), 'python': threading.active_count(),\n"
        "      'tasks': sorted(os.listdir('/proc/self/task')) == [str(os.getpid())]})\n"
    ),
    "descriptors": _HEAD + (
        "import stat\n"
        "fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
        "open_now = []\n"
        "for fd in range(1024):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "        open_now.append(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "kinds = [os.readlink('/proc/self/fd/0')] + [stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (1, 2)]\n"
        "show({'listed': fds, 'open': open_now, 'kinds': kinds})\n"
    ),
    "signals": _HEAD + (
        "import signal\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())\n"
        "masks = {key: status[key].strip() for key in ('SigPnd', 'ShdPnd', 'SigBlk', 'SigIgn', 'SigCgt')}\n"
        "handlers = {s.name: repr(signal.getsignal(s)) for s in signal.valid_signals()\n"
        "            if isinstance(s, signal.Signals)}\n"
        "show({'masks': masks, 'handlers': handlers, 'timer': signal.getitimer(signal.ITIMER_REAL),\n"
        "      'blocked': sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, [])))})\n"
    ),
    "modules": _HEAD + (
        "import builtins, math, fractions\n"
        "launcher = sys._getframe(1).f_globals\n"
        "show({'sqrt': math.sqrt(16), 'dumps': json.dumps([1]), 'fraction': str(fractions.Fraction(1, 3)),\n"
        "      'len': len([1, 2]), 'print': builtins.print is print and print.__module__ == 'builtins',\n"
        "      'modules': sorted(sys.modules), 'path': sys.path,\n"
        "      'launcher': sorted((k, type(v).__name__, getattr(v, '__module__', None)) for k, v in launcher.items()\n"
        "                         if k not in ('__builtins__',)),\n"
        "      'launcher_modules': sorted(launcher.get('LAUNCHER_MODULES', ()))})\n"
    ),
    "limits": _HEAD + (
        "import resource\n"
        "names = [n for n in dir(resource) if n.startswith('RLIMIT_')]\n"
        "show({n: resource.getrlimit(getattr(resource, n)) for n in sorted(names)})\n"
    ),
}
