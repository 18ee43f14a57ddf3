"""The one inference function: micro-batching on real ONNX Runtime sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from app.cards import ModelCard
from app.repository.registry import ModelRepository
from app.runtime.engine import Arrays, NonFiniteOutput, infer
from app.runtime.sessions import CPU_CALL_BYTES, SessionPool


class CountingPool(SessionPool):
    """Real sessions; counts the ONNX Runtime calls and the rows in each."""

    def __init__(self) -> None:
        super().__init__("cpu", 1)
        self.calls: list[int] = []

    def run(self, card: ModelCard, inputs: Arrays) -> Arrays:
        self.calls.append(int(next(iter(inputs.values())).shape[0]))
        return super().run(card, inputs)


@pytest.fixture(scope="module")
def card(model_repository: Path) -> ModelCard:
    return ModelRepository(model_repository).resolve("digits")


def requests_of(sizes: list[int]) -> list[Arrays]:
    pixels = load_digits().data.astype(np.float32)
    out, start = [], 0
    for n in sizes:
        out.append({"pixels": pixels[start : start + n]})
        start += n
    return out


def test_batched_results_are_bit_identical_to_one_call_per_job(card: ModelCard) -> None:
    requests = requests_of([1, 3, 1, 2, 1] * 20)  # 160 rows in 100 jobs
    pool = CountingPool()
    batched = infer(pool, card, requests)
    assert card.batching.max_batch_size == 64
    assert len(pool.calls) < 10 and max(pool.calls) <= 64
    for request, result in zip(requests, batched, strict=True):
        assert not isinstance(result, Exception)
        alone = pool.run(card, request)
        for name in alone:
            assert result[name].shape[0] == request["pixels"].shape[0]
            assert np.array_equal(result[name], alone[name]), name


def test_a_bad_request_fails_alone_and_the_others_still_share_a_call(card: ModelCard) -> None:
    good = requests_of([1, 1, 1])
    bad_shape = {"pixels": np.zeros((1, 63), dtype=np.float32)}
    pool = CountingPool()
    results = infer(pool, card, [good[0], bad_shape, good[1], good[2]])
    assert isinstance(results[1], Exception)
    assert not any(isinstance(r, Exception) for r in (results[0], results[2], results[3]))
    assert pool.calls[0] == 3, "different trailing shapes never share a call"


def test_non_finite_outputs_fail_only_their_own_request(card: ModelCard) -> None:
    good = requests_of([2, 1])
    huge = {"pixels": np.full((1, 64), 3e38, dtype=np.float32)}
    pool = CountingPool()
    results = infer(pool, card, [good[0], huge, good[1]])
    assert pool.calls == [4], "the three ran in one call"
    assert isinstance(results[1], NonFiniteOutput)
    for request, result in ((good[0], results[0]), (good[1], results[2])):
        assert not isinstance(result, Exception)
        assert np.array_equal(result["label"], pool.run(card, request)["label"])


def test_a_request_larger_than_the_batch_limit_runs_alone(card: ModelCard) -> None:
    requests = requests_of([100, 1, 1])
    pool = CountingPool()
    results = infer(pool, card, requests)
    assert sorted(pool.calls) == [2, 100]
    assert [r["label"].shape[0] for r in results if not isinstance(r, Exception)] == [100, 1, 1]


def test_a_model_without_batching_runs_one_call_per_request(model_repository: Path) -> None:
    slow = ModelRepository(model_repository).resolve("slow")
    assert slow.batching.max_batch_size == 0
    request = {"x": np.zeros((1, 64), np.float32), "steps": np.array([1], np.int64)}
    pool = CountingPool()
    results = infer(pool, slow, [request, request])
    assert pool.calls == [1, 1] and not any(isinstance(r, Exception) for r in results)


def test_a_failing_model_s_file_is_looked_at_again_on_its_next_call(tmp_path: Path) -> None:
    """A fix deployed right after a failure (and its dead letters replayed at once)
    is run at once, not after the file's next periodic look (STAT_EVERY_S)."""
    from tests.models import HUGE, build_memhog

    build_memhog(tmp_path)
    card = ModelRepository(tmp_path).resolve("memhog")
    pool = SessionPool("cpu", 1)
    huge = {"n": np.array([HUGE], dtype=np.int64)}
    with pytest.raises(Exception, match="allocate"):
        pool.run(card, huge)
    build_memhog(tmp_path, fixed=True)  # within the second: no periodic look yet
    assert float(pool.run(card, huge)["total"]) == 1000.0


def test_on_cpu_many_rows_run_in_calls_of_cache_sized_parts_with_the_same_result(
    card: ModelCard,
) -> None:
    """A batch's chunk of 5,000 rows runs in calls of CPU_CALL_BYTES of inputs (1,024
    digits rows of 256 bytes), bit for bit what one call of all of them gives."""
    pixels = np.resize(load_digits().data.astype(np.float32), (5000, 64))
    pool = SessionPool("cpu", 1)
    session = pool.get(card)
    names = ["label", "probabilities"]
    whole = dict(zip(names, session.run(names, {"pixels": pixels}), strict=True))
    calls: list[int] = []
    run = session.run

    def counted(names: list[str], feeds: Arrays) -> list[np.ndarray]:
        calls.append(len(feeds["pixels"]))
        return run(names, feeds)

    session.run = counted  # type: ignore[method-assign]  # the real call, counted
    cut = pool.run(card, {"pixels": pixels})
    assert calls == [1024] * 4 + [904]
    assert CPU_CALL_BYTES // (64 * 4) == 1024
    for name, array in whole.items():
        assert np.array_equal(cut[name], array), name
    calls.clear()
    pool.run(card, {"pixels": pixels[:64]})  # at most max_batch_size rows: one call
    assert calls == [64]
