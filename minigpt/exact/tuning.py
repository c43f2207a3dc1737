"""How the kernels cut the weights into blocks, and the file-locked store of measured choices. The
exact kernels' bits do not depend on the cut (the numbers that do are minigpt.exact.threads'), so it
follows the machine: from its caches, or as `python -m minigpt tune` measured and kept it per CPU,
BLAS build and thread count (docs/exactness.md, point 3). MINIGPT_TUNING=off ignores a kept choice.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import os
import stat
import sys
import tempfile
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import unique_keys
from .threads import threads

MIB = 2**20


NEVER = 10**9  # a row count no forward reaches
OPENBLAS_SPLIT = 460_800  # OpenBLAS splits a gemv between its threads from m x n >= 115200 x 4 weights on


@dataclass(frozen=True)
class Tuning:
    """How the kernels cut the weights; none of it changes a bit of the exact kernels' results."""

    one_row_block: int  # weights per gemv call for one row (a share of L3): OpenBLAS splits each call
    multi_row_block: int  # weights per gemv call for several rows, every row passing over a block in turn
    shared_block: int  # weights per gemv call when minigpt's own threads share the blocks (a share of L2)
    shared_rows: int  # from this many rows on, shared blocks rather than multi_row_block ones (NEVER: never)
    gemm_rows: int  # the fast kernels: from this many rows on, one gemm per matrix rather than gemvs


def cache_bytes(level: int) -> int | None:
    """The size of the data cache of `level` that CPU 0 reports (sysfs), or None."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((index / "level").read_text()) == level and (index / "type").read_text().strip() != "Instruction":
                size = (index / "size").read_text().strip().upper()
                return int(size[:-1]) * {"K": 1024, "M": MIB}[size[-1]] if size[-1] in "KM" else int(size)
        except (OSError, ValueError):
            continue
    return None


def machine_default() -> Tuning:
    """From the caches: one row in blocks of half of L3 (at most 32 MiB), OpenBLAS splitting them;
    several rows shared between minigpt's threads in blocks of 40% of L2, each thread copying its own
    blocks (linear.COPY_ROWS), or with one thread in blocks of 60% of L2; gemm from 16 rows (1 MiB
    and 32 MiB when the kernel reports no caches)."""
    l2, l3 = cache_bytes(2) or MIB, cache_bytes(3) or 32 * MIB
    return Tuning(min(l3 // 2, 32 * MIB) // 4, int(0.6 * l2) // 4, int(0.4 * l2) // 4,
                  2 if threads() > 1 else NEVER, 16)


def key() -> str:
    """What a kept choice is valid for: the CPU, the BLAS build and kernels, the thread count."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return (f"{cpu} | {blas.get('name')} {blas.get('version')} | {os.environ.get('OPENBLAS_CORETYPE', 'auto')} | "
            f"{threads()} threads")


def kept_path() -> Path:
    """The file of kept choices: $XDG_CACHE_HOME/minigpt/tuning.json (~/.cache by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minigpt" / "tuning.json"


KEPT_BYTES = 2**20  # a file of kept choices is far smaller: anything larger is not one
FIELDS = tuple(Tuning.__dataclass_fields__)


def read_kept(path: Path) -> dict[str, dict]:
    """The kept choices in `path`, machine key -> fields; {} if there is no file. Anything but a
    regular file of at most KEPT_BYTES holding a JSON object of objects, without duplicate keys,
    raises ValueError saying why (a FIFO is not waited on, a device is not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return {}
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = f.read(KEPT_BYTES + 1)
    if len(data) > KEPT_BYTES:
        raise ValueError(f"larger than {KEPT_BYTES} bytes")

    try:
        kept = json.loads(data, object_pairs_hook=unique_keys)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(kept, dict) or not all(isinstance(v, dict) for v in kept.values()):
        raise ValueError("not a JSON object of objects")
    return kept


def as_tuning(fields: dict) -> Tuning:
    """A kept entry as a Tuning: exactly its fields, each a whole number from 1 to NEVER."""
    if set(fields) != set(FIELDS):
        raise ValueError(f"its fields are not {', '.join(FIELDS)}")
    for name, value in fields.items():
        if type(value) is not int or not 1 <= value <= NEVER:
            raise ValueError(f"{name} is not a whole number from 1 to {NEVER}")
    return Tuning(**fields)


@cache
def current() -> Tuning:
    """The tuning in force: the kept choice for this machine, else the machine's default. A file
    that cannot be a file of kept choices is ignored, with one line on stderr naming it."""
    if os.environ.get("MINIGPT_TUNING", "").lower() != "off":
        path = kept_path()
        try:
            entry = read_kept(path).get(key())
            if entry is not None:
                return as_tuning(entry)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            print(f"minigpt: ignoring the kept tuning in {path} ({reason}); using the defaults", file=sys.stderr)
    return machine_default()


_TUNED: contextvars.ContextVar[Tuning | None] = contextvars.ContextVar("minigpt_tuning", default=None)


def in_force() -> Tuning:
    """The cut the kernels use: `tuned`'s, else `current()`."""
    return _TUNED.get() or current()


@contextlib.contextmanager
def tuned(choice: Tuning) -> Iterator[None]:
    """Run with another cut of the weights (the tuner's candidates; the property that bits do not move)."""
    token = _TUNED.set(choice)
    try:
        yield
    finally:
        _TUNED.reset(token)


def keep(tuning: Tuning) -> Path:
    """Keep a measured choice for this machine. Other machines' choices in the file stay; a file
    that cannot be read as one is replaced. The write is atomic (a new file renamed over the old)
    and made under a lock, so readers never see half a file and concurrent keeps lose no entry."""
    path = kept_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / (path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            kept = read_kept(path)
        except (OSError, ValueError):
            kept = {}
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({**kept, key(): asdict(tuning)}, indent=1) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    current.cache_clear()
    return path
