"""The stream door: input logs in, output logs out (Redis Streams by default).

A consumer process reads every active binding's input log with one consumer
group, turns each batch of entries into jobs with one binding operation, and
acknowledges them only after that committed; a publisher in the same process
appends each finished job's result to its binding's output log once, through the
outbox of `stream_entries`. Entries that cannot become a job go to the binding's
dead-letter log with a problem object saying why. It imports nothing of the
HTTP door.
"""


def unstaged(point: str) -> None:
    """A `checkpoint` that does nothing: the service's. The fault suite passes one
    that stages a crash at a named point (between a batch's commit and its
    acknowledgement, between appending results and recording them)."""
