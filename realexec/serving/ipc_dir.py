"""The front end's private socket folder: `<tmp>/kvpd-<pid>-<random>`, removed on close.

The owner's process id in the name lets the next front end remove the folder of one that was
killed (`kill -9` runs no clean-up): `remove_stale` deletes every `kvpd-<pid>-*` folder under
the temp directory whose process is gone and that belongs to this user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("kvpd.client")

PREFIX = "kvpd-"
_NAME = re.compile(r"^kvpd-(\d+)-[A-Za-z0-9_]+$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale(tmp: str | None = None) -> list[Path]:
    """Remove socket folders of front ends that are gone; returns what was removed."""
    root = Path(tmp or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for d in root.iterdir():
            m = _NAME.match(d.name)
            if m is None or not d.is_dir() or _pid_alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                if d.stat().st_uid != os.getuid():
                    continue
                shutil.rmtree(d)
                removed.append(d)
                log.warning("removed the socket folder %s of a front end that is gone", d)
    return removed


def make_ipc_dir() -> str:
    """A fresh socket folder for this process (stale ones are removed first)."""
    remove_stale()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
