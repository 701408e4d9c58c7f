"""What ranks other than 0 do: hold the same model, replay each job rank 0 announces, write no media.

A follower's Backend is built from the same flags and environment as rank 0's (same model, same adapter policy and
allowed folders), then :func:`bind` points its output folder at a private scratch folder emptied after every job:
the video, audio and images are rank 0's to write (the followers' copies would be identical).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from .context_parallel import parallelize
from .diagnostics import weights_digests
from .group import STOP, RankGroup
from .timeouts import RankLost


def bind(group: RankGroup, backend: Any) -> None:
    """Called by the Backend on every rank once its model is loaded."""
    for name in ("transformer", "transformer_ref"):
        if name in backend.model.components:
            parallelize(backend.model.components[name], group.spec)
    if not group.leader:
        backend.output_dir = Path(tempfile.mkdtemp(prefix=f"h3app-rank{group.rank}-"))


def _wait(backend: Any, handle: Any) -> Any:
    return backend.run(handle)


REPLAY: dict[str, Callable[..., Any]] = {
    "submit_load": lambda backend, *args: _wait(backend, backend.submit_load(*args)),
    "submit_generate": lambda backend, *args: _wait(backend, backend.submit_generate(*args)),
    "submit_equivalence": lambda backend, *args: _wait(backend, backend.submit_equivalence(*args)),
    "grid": lambda backend, *args: list(backend.grid(*args)),
    "weights_digests": weights_digests,
}


def follow(group: RankGroup, backend: Any) -> int:
    """Serve rank 0's jobs until it stops (returns 0) or a rank is lost (returns 3). A job's error was already
    shared with every rank; here it only goes to this rank's log."""
    while True:
        call = group.receive()
        if call == STOP:
            return 0
        try:
            REPLAY[call.method](backend, *call.args)
        except RankLost as lost:
            print(f"rank {group.rank}: {lost}", file=sys.stderr, flush=True)
            return 3
        except Exception as error:  # already reported to rank 0 by the job's agreement; the loop serves on
            print(f"rank {group.rank}: job {call.method} failed: {type(error).__name__}: {error}", file=sys.stderr,
                  flush=True)
        finally:
            _empty(backend.output_dir)


def _empty(folder: Path) -> None:
    for path in Path(folder).iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
