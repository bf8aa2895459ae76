"""End the sandbox's code process as `python script.py` ends, without the interpreter's teardown.

A launcher forked from the warm server (`serve`) shares the server's memory until it writes to it, and
tearing an interpreter down writes to nearly all of it (every module's objects are released, the collector walks
them all), each page copied before it is written: about 6 ms a call on the 2-core CPU machine, more than all the
layers take to apply (`benchmarks/sandbox_calls.py --layers`). So once the code has run (`child.main`),
`end_process` does what Python does at exit that the code can see (non-daemon threads joined, atexit functions run,
SystemExit's code and message, the code's own globals released so that their finalizers run and their buffered files
are flushed, stdout and stderr flushed) and then leaves with os._exit. What it does not do: finalize objects that
only the interpreter's teardown reaches (objects held by other modules, cycles the collector would find).

Like `child.py` it is stdlib only and valid Python 3.8; `tracerl.io.sandbox` hands its text to the launcher, which
registers it under this module's name. Nothing here applies a layer.
"""

import atexit
import os
import sys
import traceback


def exit_status(exc, _int=int, _isinstance=isinstance, _str=str, _sys=sys):
    """The status Python exits with on an uncaught SystemExit: its code (None: 0; an int: its low byte, as exit()
    keeps it), else 1 after the code is printed to stderr."""
    code = exc.code
    if code is None:
        return 0
    if _isinstance(code, _int):
        return code & 0xFF
    try:
        _sys.stderr.write(_str(code) + "\n")
    except BaseException:
        pass
    return 1


def flush(status, _sys=sys, _repr=repr, _type=type, _getattr=getattr):
    """Flush sys.stdout and sys.stderr, whatever the code made of them; 120 if stdout could not be, as Python
    exits then, else `status`."""
    for name in ("stdout", "stderr"):
        stream = _getattr(_sys, name, None)
        try:
            if stream is not None:
                stream.flush()
        except BaseException as exc:
            if name == "stdout":
                status = 120
                try:
                    _sys.stderr.write("Exception ignored in: %s\n%s: %s\n" % (_repr(stream), _type(exc).__name__, exc))
                except BaseException:
                    pass
    return status


def end_process(status, names, _modules=sys.modules, _atexit=atexit._run_exitfuncs, _exit=os._exit,
                _print_exc=traceback.print_exc, _flush=flush, _reversed=reversed, _list=list):
    """Python's exit without the teardown: non-daemon threads joined, atexit functions run, the script's globals
    released newest first (a finalizer still finds the names defined before its object), stdout and stderr flushed
    (a failed stdout flush exits 120, as Python does); then os._exit."""
    threading = _modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            _print_exc()
    try:
        _atexit()
    except BaseException:
        _print_exc()
    status = _flush(status)
    try:
        for name in _reversed(_list(names)):
            if name != "__builtins__":
                del names[name]
    except BaseException:
        _print_exc()
    _exit(_flush(status))
