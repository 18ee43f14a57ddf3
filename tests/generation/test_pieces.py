"""Following a generation's pieces over Redis: a retry that goes on from fewer
tokens than its dead attempt published gives the follower only what is new."""

from __future__ import annotations

import threading
import time
import uuid

import redis

from app.generation.pieces import PiecePublisher, follow
from app.platform.settings import Settings


def _publish(settings: Settings, job_id: uuid.UUID, at: int | None, *texts: str) -> None:
    publisher = PiecePublisher(lambda: redis.Redis.from_url(settings.redis_url))
    if at is not None:
        publisher.start(job_id, at)
    for text in texts:
        publisher.add(job_id, text)
        publisher.flush({})
        time.sleep(0.03)  # (each its own piece)


def test_a_retry_overlapping_what_was_sent_adds_only_its_new_end(settings: Settings) -> None:
    job_id = uuid.uuid4()
    whole = "Once upon a time, there was a dragon."
    texts: list[str] = []
    follower = threading.Thread(target=lambda: texts.extend(
        p.text for p in follow(redis.Redis.from_url(settings.redis_url), job_id,
                               lambda: None, timeout_s=30, check_s=60)))  # fmt: skip
    follower.start()
    time.sleep(0.3)  # subscribed
    # The dead attempt published "Once upon a time," but recorded only "Once upon".
    _publish(settings, job_id, None, "Once", " upon", " a time,")
    # The retry goes on from the recorded "Once upon": " a time," again, then more.
    _publish(settings, job_id, len("Once upon"), " a time,", " there was", " a dragon.")
    publisher = PiecePublisher(lambda: redis.Redis.from_url(settings.redis_url))
    publisher.start(job_id, len(whole))
    publisher.flush({job_id: {"final": True, "status": "succeeded", "output": whole}})
    follower.join(30)
    assert "".join(texts) == whole
    assert texts[-1] == "", "all of it streamed: nothing was held back for the end"


def test_a_lost_piece_holds_the_text_back_until_the_whole_output(settings: Settings) -> None:
    job_id = uuid.uuid4()
    texts: list[str] = []
    follower = threading.Thread(target=lambda: texts.extend(
        p.text for p in follow(redis.Redis.from_url(settings.redis_url), job_id,
                               lambda: None, timeout_s=30, check_s=60)))  # fmt: skip
    follower.start()
    time.sleep(0.3)
    _publish(settings, job_id, None, "Hello")
    _publish(settings, job_id, len("Hello, wor"), "ld")  # ", wor" never came
    publisher = PiecePublisher(lambda: redis.Redis.from_url(settings.redis_url))
    publisher.flush({job_id: {"final": True, "status": "succeeded", "output": "Hello, world"}})
    follower.join(30)
    assert texts == ["Hello", ", world"], texts
