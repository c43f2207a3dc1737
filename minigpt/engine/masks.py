"""The mask thread: a constrained sequence's next grammar mask computed beside the steps, so that a
costly mask holds up its own sequence only, never the batch (docs/logits-processing.md).
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from .job import Job

MASK_WAIT_SECONDS = 0.05  # a step in which no sequence is ready waits this long for a mask, then returns


class MaskThread:
    """Sequences' processing work (Sequence.prepare) on one thread of its own, started by the first
    sequence that needs it."""

    def __init__(self):
        self.thread: ThreadPoolExecutor | None = None
        self.preparing: dict[Job, Future] = {}  # jobs whose next mask it computes

    def ready(self, jobs: list[Job]) -> list[Job]:
        """Those of the running jobs that take part in this step: one whose mask is still being
        computed sits out. With none ready, waits up to MASK_WAIT_SECONDS for one. A job that has
        finished is forgotten (its mask, if not begun, never begins)."""
        for job in [job for job in self.preparing if job.finished]:
            self.preparing.pop(job).cancel()
        for job in jobs:
            if job not in self.preparing and not job.seq.done and not job.seq.ready:
                self.thread = self.thread or ThreadPoolExecutor(1, "minigpt-masks")
                self.preparing[job] = self.thread.submit(job.seq.prepare)  # its error is raised again by choose
        if jobs and all(job in self.preparing for job in jobs):
            wait(self.preparing.values(), MASK_WAIT_SECONDS, FIRST_COMPLETED)
        ready = [job for job in jobs if job not in self.preparing or self.preparing[job].done()]
        for job in ready:
            self.preparing.pop(job, None)
        return ready
