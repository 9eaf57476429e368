"""Every process of the server ends when the process that started it ends.

``python -m serve`` starts MAX's server (serve/engine.py) in a session of its
own, and the engine starts its model and metrics workers with
multiprocessing's spawn. A process killed with SIGKILL can tell nobody: its
children went on serving and held both ports, so that the next start failed
with "port in use". Each of them therefore asks the kernel for a signal when
its parent ends (Linux's PR_SET_PDEATHSIG): the engine for SIGTERM, on which
it stops as on Ctrl-C (the requests in flight finish, then its workers end);
a worker for SIGKILL, its engine being gone. Elsewhere nothing is asked.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# The pid of the process that started this one, set by that process: a parent
# that ends before its child has asked for the signal is seen this way.
PARENT = "GPT2_SERVE_PARENT"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_parent(signum: signal.Signals) -> None:
    """``signum`` to this process when the process named in ``PARENT`` ends
    (where one is named and the system can say it); then this process is
    named as the parent of the ones it starts."""
    parent = os.environ.get(PARENT)
    # Its own pid: this process asked already, then executed itself again
    # (MAX's entry does, keeping the pid), and the signal asked for is kept.
    if parent and int(parent) != os.getpid() and sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum))
        if os.getppid() != int(parent):  # it ended before the line above
            os.kill(os.getpid(), signum)
    os.environ[PARENT] = str(os.getpid())

