"""What stands at a path, looked at without opening it.

Something else under a file's exact name (a directory, a FIFO that would hang, a device, a symlink
loop, an unsearchable directory) must not pass for "missing" nor become a traceback: each is the
caller's `error`, naming the path.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import MinigptError

KINDS = ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
         (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def kind(path: str | os.PathLike, error: type[MinigptError]) -> str | None:
    """What is at `path`, symlinks followed: "a file", "a directory", "a FIFO", ..., or None when
    nothing is; a symlink loop or an unsearchable directory is `error` saying so."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # also a dangling symlink, or a file where a folder should be
        return None
    except ValueError as e:  # a NUL character: no file system has such a name
        raise error(f"{str(path)!r} is not a valid path: {e}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise error(f"{path} is a symlink loop") from None
        raise error(f"cannot look into the directory {Path(path).parent}: {e.strerror or e}") from None
    return next((name for test, name in KINDS if test(mode)), "not a file or directory")


def is_file(path: str | os.PathLike, error: type[MinigptError]) -> bool:
    """True if `path` is a regular file, False if nothing is there; anything else there is `error`."""
    what = kind(path, error)
    if what not in (None, "a file"):
        raise error(f"{path} is {what}, not a file")
    return what == "a file"


def list_directory(directory: str | os.PathLike, error: type[MinigptError]) -> list[str]:
    """The names in `directory`; a directory that cannot be read (no r permission) is `error` naming it."""
    try:
        return os.listdir(directory)
    except OSError as e:
        raise error(f"cannot list the directory {directory}: {e.strerror or e}") from None
