"""``destroy_process_group`` frees the default group when ``lazykern.distributed`` is in use.

``torch.distributed.nn.functional`` takes ``group=group.WORLD`` as a default evaluated at import;
``torch.optim`` imports it (through ``torch._dynamo``) on the first optimizer. Imported after
``init_process_group``, it would hold the default group for the life of the process, and gloo's
worker threads would outlive the interpreter's shutdown, where one still releasing a tensor aborts
the process ("terminate called without an active exception": 15 of 60 two-worker runs on a loaded
machine, 0 of 60 with the import first; docs/distributed.rst). ``lazykern.distributed`` imports it
first. Checked in a fresh interpreter, where nothing has imported it yet.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import socket, sys
    import lazykern.distributed
    import torch, torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.optim.Adam([torch.nn.Parameter(torch.ones(2))])  # imports torch._dynamo after the group exists
    group = dist.group.WORLD
    dist.destroy_process_group()
    print(sys.getrefcount(group) - 1)  # references besides `group` (getrefcount's own argument excluded)
    """
)


def test_destroy_process_group_frees_the_default_group():
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "1", f"the default group is still referenced: {proc.stdout}"
