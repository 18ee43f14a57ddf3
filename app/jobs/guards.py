"""The safety guards of the execute path, the sweeps, the drain task and the stream
door, as one policy.

Every process runs with all of them on (`Guards()`, what `Container` gets by
default). Only the fault suite builds a container with some off (its own Celery
entry point, tests/faults/worker.py), to show what each guard prevents; no
setting switches one off.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final


@dataclass(frozen=True)
class Guards:
    """Which guards are on; each one is by default.

    - `claim`: a claim takes only claimable jobs (the checks of the claim's
      UPDATE: queued and due, within the attempt cap and the deadline), so a
      running job is never claimed, and run, twice;
    - `finish`: only the attempt that claimed a job, while it still runs, writes
      its outcome (the state and attempt checks of the finish's UPDATE), so a late
      or duplicate writer changes nothing;
    - `lease`: jobs of a dead worker are taken back once their lease ran out, by
      the sweep or by a message redelivered for them;
    - `cap`: a job that keeps failing for a transient reason stops at its attempt
      cap, with a dead letter, instead of being retried forever;
    - `republish`: the sweep sends a wake-up again for jobs whose message was lost
      with the broker or never sent;
    - `retry`: a drain whose database or Redis went away sends its wake-up again
      later, with backoff, instead of dropping it;
    - `ack`: the stream door acknowledges an input entry only after its job's
      record is committed, so a consumer that dies in between loses nothing;
    - `redelivery`: an input entry delivered again finds the job it made (by the
      entry's id) instead of making a second;
    - `dedupe`: a result is appended to its output log once, under a mark set in
      the same step, so a publisher that died before recording it does not append
      it again;
    - `resume`: a retried generation goes on from the tokens its earlier attempts
      recorded, so none of its text is made, recorded or streamed twice (off: it
      starts again from its prompt, and a follower of its events gets the text its
      dead attempt recorded a second time);
    - `journal`: a sync lane call's record is journaled in Redis in the same step
      that answers it, so a worker that dies between answering and writing the
      record to PostgreSQL loses none (off: the record lives only in the worker's
      memory until written);
    - `steps`: a retried pipeline job reads the steps its earlier attempts
      recorded and resumes at its first unfinished one (off: it runs every step
      again, so a step that had finished runs twice).
    """

    claim: bool = True
    finish: bool = True
    lease: bool = True
    cap: bool = True
    republish: bool = True
    retry: bool = True
    ack: bool = True
    redelivery: bool = True
    dedupe: bool = True
    resume: bool = True
    journal: bool = True
    steps: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def off(cls, *names: str) -> Guards:
        """Every guard on except those named; a name that is no guard is an error."""
        unknown = sorted(set(names) - set(cls.names()))
        if unknown:
            raise ValueError(
                f"no such guard: {', '.join(unknown)} (guards: {', '.join(cls.names())})"
            )
        return cls(**dict.fromkeys(names, False))


ALL_ON: Final = Guards()
