"""What ranks other than 0 do: hold the same model, queue each job value rank 0 announces, write no media.

A follower's Backend is built from the same flags and environment as rank 0's (same model, same adapter policy and
allowed folders), then :func:`bind` (on every rank) injects the lockstep job wrapper and points a follower's output
folder at a private scratch folder emptied after every job: the video, audio and images are rank 0's to write (the
followers' copies would be identical).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from ..rules.choices import PARTITIONS
from .context_parallel import parallelize
from .decode import spread_decode
from .group import STOP, RankGroup
from .lockstep import Lockstep
from .rank_backend import RankBackend
from .timeouts import RankLost

VIDEO_VAE = "vae"  # the pipeline's video VAE component


def bind(group: RankGroup | None, backend: RankBackend) -> None:
    """Called by the entry points on every rank once the Backend is built (no-op for one rank): shard the held
    transformers, spread the video decode's tiles over the ranks (``parallel.decode``), run every job in lockstep
    (``backend.wrap_job``), and give a follower a scratch output folder."""
    if group is None:
        return
    for name in PARTITIONS:
        if name in backend.model.components:
            parallelize(backend.model.components[name], group.spec)
    if VIDEO_VAE in backend.model.components:
        spread_decode(backend.model.components[VIDEO_VAE], group.step)  # each rank decodes its share of the tiles
    backend.wrap_job = Lockstep(group, backend.model.transformer)
    if not group.leader:
        backend.output_dir = Path(tempfile.mkdtemp(prefix=f"h3app-rank{group.rank}-"))


def follow(group: RankGroup, backend: RankBackend) -> int:
    """Serve rank 0's jobs until it stops (returns 0) or a rank is lost (returns 3). A job's error was already
    shared with every rank; here it only goes to this rank's log."""
    while True:
        job = group.receive()
        if isinstance(job, str) and job == STOP:
            return 0
        try:
            backend.run(backend.submit(job))  # the same job value rank 0 queued, on this rank's Backend
        except RankLost as lost:
            print(f"rank {group.rank}: {lost}", file=sys.stderr, flush=True)
            return 3
        except Exception as error:  # already reported to rank 0 by the job's agreement; the loop serves on
            print(f"rank {group.rank}: job failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        finally:
            _empty(backend.output_dir)


def _empty(folder: Path) -> None:
    for path in Path(folder).iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
