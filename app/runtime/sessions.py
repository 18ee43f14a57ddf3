"""ONNX Runtime sessions: one per model version per process, made on first use.

Sessions are created lazily, so a forked worker child builds its own after the
fork (ORT sessions and CUDA contexts must not cross a fork). The provider is
chosen by trying it: `onnxruntime-gpu` lists CUDA as available even on a
machine without a GPU, so the session's own provider list is what counts.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from typing import Any

import numpy as np
import onnxruntime as ort

from app.cards import ModelCard
from app.runtime.datatypes import ORT_TO_V2
from app.runtime.pipeline import unknown_steps

logger = logging.getLogger(__name__)

STAT_EVERY_S = 1.0
# On CPU a call of many rows (a batch's chunk) runs as calls of about this many
# bytes of inputs, and never fewer rows than the card's max_batch_size: ORT ran
# digits at 1.88 ms of CPU per 1,000 rows in calls of 16,384 rows and at 1.25 in
# calls of 1,024, whose working set stays in the CPU's caches. A GPU wants the
# largest call it can get, so there a call is never cut.
CPU_CALL_BYTES = 256 * 1024

_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}


class ModelMismatch(RuntimeError):
    """The ONNX graph does not have the inputs or outputs its card declares."""


def device_for(process_index: int, devices: tuple[int, ...]) -> int | None:
    """The GPU a worker process owns: one process per GPU, round robin beyond."""
    return devices[process_index % len(devices)] if devices else None


class SessionPool:
    """A process's sessions, one per model version, made on first use. At most
    `max_loaded` (MAX_LOADED_MODELS; 0: no bound) are kept: loading one more
    closes the least recently used, except those used within their card's
    `keep_alive_seconds`. `retain` closes those of versions that stopped serving.
    A run under way keeps its session alive until it ends (it holds a reference),
    so closing one never fails a call already running on it."""

    def __init__(
        self,
        provider: str = "auto",
        intra_op_threads: int = 1,
        device_id: int | None = None,
        max_loaded: int = 0,
    ) -> None:
        if provider not in ("auto", "cpu", "cuda"):
            raise ValueError(f"ORT_PROVIDER must be auto, cpu or cuda, not {provider!r}")
        self.provider = provider
        self.intra_op_threads = intra_op_threads
        # The GPU this process's CUDA sessions run on (None: ORT's default, 0).
        self.device_id = device_id
        self.max_loaded = max_loaded
        # ref -> (model file's mtime, session): a replaced file is loaded again.
        self._sessions: dict[str, tuple[int, ort.InferenceSession]] = {}
        # ref -> the card whose file was last looked at, and when
        self._checked: dict[str, tuple[ModelCard, float]] = {}
        self._used: dict[str, float] = {}  # ref -> its last use (the bound closes the oldest)
        self._lock = threading.Lock()

    def get(self, card: ModelCard) -> ort.InferenceSession:
        """The card's session. Its file is looked at again for a new card (the
        repository saw a change) and otherwise at most every STAT_EVERY_S: an
        inline model's calls would stat it each. A file gone since its session
        was made leaves the session serving until the version stops serving."""
        now = time.monotonic()
        self._used[card.ref] = now
        cached = self._sessions.get(card.ref)
        seen, at = self._checked.get(card.ref, (None, 0.0))
        if cached is not None and seen is card and now - at < STAT_EVERY_S:
            return cached[1]
        try:
            mtime = card.onnx_path.stat().st_mtime_ns
        except FileNotFoundError:
            if cached is None:
                raise
            # Removed while a call of it runs here: that call finishes on what is
            # loaded; `retain` closes the session once the repository drops it.
            return cached[1]
        if cached is None or cached[0] != mtime:
            with self._lock:
                cached = self._sessions.get(card.ref)
                if cached is None or cached[0] != mtime:
                    cached = (mtime, self._create(card))
                    self._sessions[card.ref] = cached
                    self._checked[card.ref] = (card, now)
                    self._bound(keep=card.ref, now=now)
        self._checked[card.ref] = (card, now)
        return cached[1]

    def loaded(self) -> list[str]:
        """The refs of the sessions held now."""
        return list(self._sessions)

    def retain(self, serving: set[str]) -> list[str]:
        """Close the sessions of versions not in `serving`; the refs closed."""
        with self._lock:
            gone = [ref for ref in self._sessions if ref not in serving]
            for ref in gone:
                self._close(ref)
        if gone:
            logger.info("closed the sessions of %s: no longer serving", ", ".join(sorted(gone)))
            release_memory()
        return gone

    def _bound(self, keep: str, now: float) -> None:
        """Past `max_loaded`, close the least recently used sessions (not `keep`,
        nor one used within its card's keep-alive). Under the lock."""
        if self.max_loaded <= 0 or len(self._sessions) <= self.max_loaded:
            return
        idle = sorted(
            (self._used.get(ref, 0.0), ref)
            for ref, (card, _) in self._checked.items()
            if ref in self._sessions and ref != keep
            and now - self._used.get(ref, 0.0) >= float(card.extra.get("keep_alive_seconds", 0))
        )  # fmt: skip
        closed = [ref for _, ref in idle[: len(self._sessions) - self.max_loaded]]
        for ref in closed:
            self._close(ref)
        if closed:
            logger.info("closed the least recently used sessions %s (MAX_LOADED_MODELS=%d)",
                        ", ".join(closed), self.max_loaded)  # fmt: skip
            release_memory()

    def _close(self, ref: str) -> None:
        self._sessions.pop(ref, None)
        self._checked.pop(ref, None)
        self._used.pop(ref, None)

    def run(
        self, card: ModelCard, inputs: dict[str, np.ndarray], names: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The graph's outputs `names` (default: the card's outputs) for `inputs`."""
        session = self.get(card)
        step = self._rows_per_call(card, session, inputs) if names is None else None
        names = names if names is not None else [spec.name for spec in card.outputs]
        try:
            if step is None:
                values = session.run(names, inputs)
            else:
                total = len(next(iter(inputs.values())))
                parts = [
                    session.run(names, {k: v[i : i + step] for k, v in inputs.items()})
                    for i in range(0, total, step)
                ]
                values = [np.concatenate(outputs) for outputs in zip(*parts, strict=True)]
        except Exception:
            # A model that fails has its file looked at again on its next call: a fix
            # deployed just now (then its dead letters replayed) is picked up at once.
            self._checked.pop(card.ref, None)
            raise
        return dict(zip(names, values, strict=True))

    @staticmethod
    def _rows_per_call(
        card: ModelCard, session: ort.InferenceSession, inputs: dict[str, np.ndarray]
    ) -> int | None:
        """How many rows each call takes when `inputs` are cut (CPU_CALL_BYTES);
        None: one call. Only a card that batches by rows, every tensor's first
        dimension its rows, is cut."""
        limit = card.batching.max_batch_size
        total = len(next(iter(inputs.values()))) if inputs else 0
        if limit <= 0 or total <= limit:
            return None
        if any(spec.shape[:1] != (-1,) for spec in (*card.inputs, *card.outputs)):
            return None
        if session.get_providers()[0] != "CPUExecutionProvider":
            return None
        row_bytes = sum(array.nbytes for array in inputs.values()) // total
        step = max(limit, CPU_CALL_BYTES // max(1, row_bytes))
        return step if step < total else None

    def _create(self, card: ModelCard) -> ort.InferenceSession:
        options = ort.SessionOptions()
        if self.intra_op_threads > 0:
            options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = 1
        wanted = self.wanted_providers()
        if self.provider == "auto":
            # Without a usable GPU, ORT prints an error and falls back to CPU. In auto
            # mode that is expected, so silence it; the provider used is logged below.
            ort.set_default_logger_severity(4)
        # A graph built for the CUDA provider (float16 where its kernels want it) is
        # loaded where CUDA is asked for; if CUDA then does not start, the CPU graph.
        cuda_graph = wanted[0] != "CPUExecutionProvider" and card.cuda_onnx_path.is_file()
        path = card.cuda_onnx_path if cuda_graph else card.onnx_path
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=wanted)
            if cuda_graph and session.get_providers()[0] == "CPUExecutionProvider":
                path = card.onnx_path
                session = ort.InferenceSession(str(path), sess_options=options, providers=wanted)
        finally:
            ort.set_default_logger_severity(2)
        used = session.get_providers()
        if self.provider == "cuda" and used[0] != "CUDAExecutionProvider":
            raise RuntimeError(f"ORT_PROVIDER=cuda but CUDA could not start for {card.ref}")
        check_card(card, session)
        device = (
            f" on GPU {self.device_id}" if used[0].startswith("CUDA") and self.device_id else ""
        )
        logger.info(
            "loaded model %s (%s) with %s%s (threads=%s)",
            card.ref, path.name, used[0], device, self.intra_op_threads,
        )  # fmt: skip
        return session

    def wanted_providers(self) -> list[Any]:
        """What sessions are asked for, CUDA (on this process's device) first where
        it may work; ORT falls back to the next entry if it does not start."""
        if self.provider == "cpu" or (
            self.provider == "auto" and "CUDAExecutionProvider" not in ort.get_available_providers()
        ):
            return list(_PROVIDERS["cpu"])
        cuda: Any = "CUDAExecutionProvider"
        if self.device_id is not None:
            cuda = ("CUDAExecutionProvider", {"device_id": str(self.device_id)})
        return [cuda, "CPUExecutionProvider"]

    def providers(self) -> dict[str, str]:
        return {ref: s.get_providers()[0] for ref, (_, s) in self._sessions.items()}


def release_memory() -> None:
    """Hand freed heap back to the system (glibc keeps it otherwise): a closed
    session's weights leave the process's RSS, not only its accounts."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator decides
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def check_card(card: ModelCard, session: ort.InferenceSession) -> None:
    """The graph takes and gives what the card says: the card's own tensors, or
    with a pipeline, the model-side tensors the pipeline declares."""

    def signature(nodes: Any) -> dict[str, str]:
        return {n.name: ORT_TO_V2.get(n.type, n.type) for n in nodes}

    if card.generation is not None:  # a decoder step (modelbuild.llama_graph)
        names = {n.name for n in session.get_inputs()} | {n.name for n in session.get_outputs()}
        if not {"input_ids", "seqlens_k", "logits", "past_key_values.0.key"} <= names:
            raise ModelMismatch(f"{card.ref}: a generative card needs a decoder step with a "
                                f"key/value cache; the graph has {sorted(names)[:8]}")  # fmt: skip
        return
    if card.code:  # its code turns the card's tensors into the graph's (checked when added)
        return
    graph_in, graph_out = card.inputs, card.outputs
    if card.pipeline is not None:
        graph_in, graph_out = card.pipeline.model_inputs, card.pipeline.model_outputs
        unknown = unknown_steps(card)
        if unknown:
            raise ModelMismatch(f"{card.ref}: the card's pipeline has unknown steps {unknown}")
    declared_in = {s.name: s.datatype for s in graph_in}
    declared_out = {s.name: s.datatype for s in graph_out}
    actual_in, actual_out = signature(session.get_inputs()), signature(session.get_outputs())
    if declared_in != actual_in or not declared_out.items() <= actual_out.items():
        raise ModelMismatch(
            f"{card.ref}: card declares graph inputs {declared_in} outputs {declared_out}, "
            f"graph has inputs {actual_in} outputs {actual_out}"
        )
