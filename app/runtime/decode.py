"""The decode loop of a generative model: continuous batching over a fixed set of slots.

One `DecodeEngine` per worker process and model. Each sequence holds a slot,
and each slot its own rows of the key/value cache: one buffer per layer and
kind, [slots, kv_heads, positions, head_size] (app.runtime.kvcache: in host
memory, or on the GPU under the CUDA provider), bound as both the past input and
the present output of the graph, so ONNX Runtime's GroupQueryAttention appends
in place and no step copies the cache. GroupQueryAttention's time and memory
follow the buffer's positions, not the tokens in it (16 sequences of 80 tokens
decoded 5x slower, and took 6.5 GB, in a buffer of 8192 positions than in one of
512), so the buffer holds what the longest sequence needs, grown and shrunk in
steps of GROW positions (a copy of the cache, once per GROW tokens at most).

A `step()` first prefills waiting prompts, up to `prefill_tokens` tokens of them
(a long prompt goes in chunks over several steps, so the others' decoding waits
at most one chunk), then runs one decode call for every sequence that is
generating: new sequences join the batch at the next step, finished or
cancelled ones leave it. A prompt that starts with one its owner's sequences
prefilled before copies those rows from the prefix cache (app.runtime.prefixes)
and prefills only the rest. With `prefill_rows` above 1, fresh prompts waiting
together prefill in one call, right-padded to the longest: a GPU's call costs
little more for a few rows than for one (a small model's calls there are bound
by their kernel launches), while on a 2-core CPU 16 prompts in one call took
0.92x the time of 16 calls, and every first token waits for the whole call: so
by default (0) it is on under the CUDA provider and off on the CPU.
The decoding sequences are kept in slots 0..n-1 (a leaver's slot is filled by
moving the last one's cache rows), so the call binds one contiguous view of
each buffer. Everything here is synchronous and owned by
one thread; the caller (app.engine.core) adds, cancels and steps.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any

import numpy as np
import onnxruntime as ort

from app.runtime.kvcache import KVCache, cache_for
from app.runtime.labels import LabelScores
from app.runtime.prefixes import PrefixCache
from app.runtime.sampling import logprob_of, pick, shape
from app.runtime.sequences import Emitted, Sequence

GROW = 256  # positions the cache buffer grows or shrinks by
# The metadata of a graph whose logits are each row's last real position's
# (modelbuild.llama_graph's name for it, which imports nothing of the service).
PER_ROW_LAST = "logits_per_row_last"


class DecodeEngine:
    def __init__(
        self,
        session: ort.InferenceSession,
        *,
        slots: int,
        context: int,
        stop_tokens: tuple[int, ...],
        prefill_tokens: int = 256,
        prefix_bytes: int = 0,
        prefill_rows: int = 1,
    ) -> None:
        self.session = session
        self.slots, self.context = slots, context
        self.stop_tokens = frozenset(stop_tokens)
        self.prefill_tokens = prefill_tokens
        # Fresh prompts one prefill call may take, right-padded to the longest: only
        # for a graph that reads each row's last position (modelbuild.llama_graph).
        metadata = session.get_modelmeta().custom_metadata_map
        if not prefill_rows:  # (0: by the provider, see the module's docstring)
            prefill_rows = slots if session.get_providers()[0] == "CUDAExecutionProvider" else 1
        self.prefill_rows = prefill_rows if metadata.get(PER_ROW_LAST) == "1" else 1
        self.waiting: deque[Sequence] = deque()
        self.decoding: list[Sequence] = []
        self.cache: KVCache = cache_for(session, slots, min(context, GROW))
        self.prefixes = PrefixCache(prefix_bytes, self.cache.token_bytes) if prefix_bytes else None
        self._binding: Any = None
        self._bound: tuple[int, int, int] | None = None  # (first, end, cache epoch)
        self._free = set(range(slots))
        self.steps = 0  # decode calls made
        self.prefill_calls = 0
        self.prefilled = 0  # prompt tokens the last prefill call took
        self.joined = 0  # prompts the last prefill call made whole (prefilled or shared)
        self.shared = 0  # prompts that took a decoding twin's cache rows instead of a prefill

    @property
    def busy(self) -> int:
        """Slots taken or promised: sequences decoding, prefilling or waiting."""
        return len(self.decoding) + len(self.waiting)

    def room(self) -> int:
        return self.slots - self.busy

    def add(self, sequence: Sequence) -> None:
        if self.room() <= 0:
            raise RuntimeError("no free decode slot")
        if not sequence.prompt or len(sequence.prompt) >= self.context:
            raise ValueError(f"a prompt of 1 to {self.context - 1} tokens")
        self.waiting.append(sequence)

    def cancel(self, key: Any) -> Sequence | None:
        """Take a sequence out wherever it is; its slot is free for the next step."""
        for sequence in [*self.waiting, *self.decoding]:
            if sequence.key == key:
                self._leave(sequence, "cancelled")
                return sequence
        return None

    @property
    def positions(self) -> int:
        """The cache buffer's positions per slot now."""
        return self.cache.positions

    def step(self) -> list[Emitted]:
        """Prefill what waits (within the budget), then one decode call for all."""
        return self.prefill() + self.decode()

    def prefill(self, budget: int | None = None, prompts: int | None = None) -> list[Emitted]:
        """Prompts into the cache, up to `budget` tokens of them (`prefill_tokens`)
        and `prompts` whole prompts (no limit); a prompt that is whole gives its
        first token and joins the decoding sequences. `prefilled` tells the tokens
        this call took, so a caller can spend a step's budget over several calls
        and publish each first token as soon as it is made."""
        emitted: list[Emitted] = []
        budget = self.prefill_tokens if budget is None else budget
        self.prefilled = whole = 0
        while self.waiting and budget > 0 and (prompts is None or whole < prompts):
            if self.prefill_rows > 1 and len(batch := self._fresh(budget)) > 1:
                took = self._prefill_rows(batch, emitted)
                budget -= took
                self.prefilled += took
                whole += len(batch)
                continue
            sequence = self.waiting[0]
            if sequence.slot < 0:
                sequence.slot = max(self._free)
                self._free.discard(sequence.slot)
            if (twin := self._twin(sequence)) is not None:
                # The same prompt decodes already (n choices of one request): its rows
                # are copied and its first logits read again, no prefill.
                self._fit(len(sequence.prompt))
                self.cache.move(twin.slot, sequence.slot, len(sequence.prompt))
                assert twin.prompt_logits is not None
                sequence.filled, logits = len(sequence.prompt), twin.prompt_logits[None]
                self.shared += 1
            else:
                if not sequence.filled and not sequence.looked:
                    self._reuse(sequence)
                chunk = sequence.prompt[sequence.filled : sequence.filled + budget]
                self._fit(sequence.filled + len(chunk))
                logits = self._run(sequence.slot, sequence.slot + 1, np.array([chunk], np.int64),
                                   np.array([sequence.filled], np.int32))  # fmt: skip
                self.prefill_calls += 1
                sequence.filled += len(chunk)
                budget -= len(chunk)
                self.prefilled += len(chunk)
                if sequence.filled < len(sequence.prompt):
                    break  # the rest in the next step's budget
            self.waiting.popleft()
            self._joins(sequence, logits[0], emitted)
            whole += 1
        self.joined = whole
        return emitted

    def _joins(self, sequence: Sequence, logits: np.ndarray, emitted: list[Emitted]) -> None:
        """A sequence whose prompt is in the cache joins the decoding ones, its
        prompt kept as a prefix, its first token drawn from the prompt's `logits`."""
        self.decoding.append(sequence)
        if self.prefixes is not None:
            self.prefixes.keep(sequence.owner, sequence.prompt,
                               partial(self.cache.save, sequence.slot))  # fmt: skip
        sequence.prompt_logits = logits.copy()
        if (item := self._next(sequence, logits)) is not None:
            emitted.append(item)

    def _fresh(self, budget: int) -> list[Sequence]:
        """The prompts at the head of the queue one padded call can take, in slots
        side by side (each the next lower free one): fresh (nothing of them in the
        cache, no kept prefix or decoding twin to copy from), whole within `budget`
        once padded to the longest, at most `prefill_rows`."""
        batch: list[Sequence] = []
        longest, slot = 0, max(self._free, default=-1)
        for sequence in self.waiting:
            size = max(longest, len(sequence.prompt))
            if (len(batch) == self.prefill_rows or sequence.slot >= 0 or sequence.filled
                    or slot not in self._free or size * (len(batch) + 1) > budget
                    or self._twin(sequence) is not None):  # fmt: skip
                break
            sequence.slot = slot
            self._free.discard(slot)
            self._reuse(sequence)
            if sequence.filled:  # a kept prefix's rows: prefilled alone, after the batch
                break
            batch.append(sequence)
            longest, slot = size, slot - 1
        return batch

    def _prefill_rows(self, batch: list[Sequence], emitted: list[Emitted]) -> int:
        """One call for fresh prompts in slots side by side, right-padded to the
        longest (each row's last logits are its own); the positions computed."""
        rows = sorted(batch, key=lambda s: s.slot)
        longest = max(len(s.prompt) for s in rows)
        self._fit(longest)
        ids = np.zeros((len(rows), longest), np.int64)
        for row, sequence in enumerate(rows):
            ids[row, : len(sequence.prompt)] = sequence.prompt
        lengths = np.array([len(s.prompt) for s in rows], np.int32)
        logits = self._run(rows[0].slot, rows[-1].slot + 1, ids, np.zeros(len(rows), np.int32),
                           lengths)  # fmt: skip
        self.prefill_calls += 1
        for _ in batch:  # (the queue's first ones)
            self.waiting.popleft()
        for sequence, row in zip(rows, logits, strict=True):
            sequence.filled = len(sequence.prompt)
            self._joins(sequence, row, emitted)
        return len(rows) * longest

    def _reuse(self, sequence: Sequence) -> None:
        """The rows of the longest kept prefix of the prompt into its slot."""
        sequence.looked = True
        if (
            self.prefixes is None
            or (hit := self.prefixes.find(sequence.owner, sequence.prompt)) is None
        ):
            return
        self._fit(hit.tokens)
        self.cache.load(hit.rows, sequence.slot, hit.tokens)
        sequence.filled = hit.tokens

    def _twin(self, sequence: Sequence) -> Sequence | None:
        """A decoding sequence of the same owner and prompt (cache rows of that
        prompt), if any. Another owner's is not one: as with kept prefixes, a
        tenant must not learn from a faster first token what another one asked."""
        if sequence.filled or sequence.scores is not None:
            return None
        size = len(sequence.prompt)
        return next((s for s in self.decoding if s.prompt_logits is not None
                     and s.owner == sequence.owner and len(s.prompt) == size
                     and s.prompt == sequence.prompt), None)  # fmt: skip

    def decode(self) -> list[Emitted]:
        """One decode call for every decoding sequence: a token each."""
        if not self.decoding:
            return []
        self._compact()
        batch = sorted(self.decoding, key=lambda s: s.slot)  # row i is slot i's
        self._fit(max(s.filled for s in batch) + 1)
        ids = np.array([[s.scores.feed() if s.scores else s.generated[-1]] for s in batch],
                       np.int64)  # fmt: skip
        lengths = np.array([s.filled for s in batch], np.int32)
        logits = self._run(0, len(batch), ids, lengths)
        self.steps += 1
        emitted = []
        for sequence, row in zip(batch, logits, strict=True):
            sequence.filled += 1
            if (item := self._next(sequence, row)) is not None:
                emitted.append(item)
        return emitted

    def _next(self, sequence: Sequence, logits: np.ndarray) -> Emitted | None:
        if sequence.scores is not None:
            return self._score(sequence, sequence.scores, logits)
        sampling, guide = sequence.sampling, sequence.guide
        row = shape(logits, sampling, sequence.seen)
        if guide is not None:
            row = guide.mask(row, sampling.max_tokens - len(sequence.generated))
        token = pick(row, sampling, sequence.rng)
        if token in self.stop_tokens:
            self._leave(sequence, "stop")
            return Emitted(sequence, None, "stop")
        logprob = None if sampling.logprobs is None else logprob_of(row, token, sampling.logprobs)
        sequence.generated.append(token)
        sequence.seen.add(token)
        if guide is not None:
            guide.accept(token)
            if guide.finished:  # the output is whole: no need to wait for a stop token
                self._leave(sequence, "stop")
                return Emitted(sequence, token, "stop", logprob)
        full = sequence.filled + 1 >= self.context
        if len(sequence.generated) >= sampling.max_tokens or full:
            self._leave(sequence, "length")
            return Emitted(sequence, token, "length", logprob)
        return Emitted(sequence, token, None, logprob)

    def _score(self, sequence: Sequence, scores: LabelScores, logits: np.ndarray) -> Emitted | None:
        """A scoring sequence's step: its labels' tokens read from the logits; it
        rewinds to the prompt's end for each label, and leaves once all are read."""
        done = (scores.first(logits, sequence.filled) if scores.start < 0
                else scores.take(logits))  # fmt: skip
        if not done:
            if scores.at == 1:  # a new label: it begins where the prompt ends
                sequence.filled = scores.start
            return None
        self._leave(sequence, "stop")
        return Emitted(sequence, None, "stop")

    def _leave(self, sequence: Sequence, reason: str) -> None:
        sequence.finish_reason = reason
        if sequence in self.decoding:
            self.decoding.remove(sequence)
        elif sequence in self.waiting:
            self.waiting.remove(sequence)
        if sequence.slot >= 0:
            self._free.add(sequence.slot)
            sequence.slot = -1

    def _fit(self, needed: int) -> None:
        """A buffer of `needed` positions or more, rounded up to GROW: grown when a
        sequence needs more, shrunk when half of it would do (cache rows kept)."""
        target = min(self.context, -(-needed // GROW) * GROW)
        held = max([s.filled for s in (*self.decoding, *self.waiting)], default=0)
        target = max(target, min(self.context, -(-held // GROW) * GROW))
        if not self.positions >= target or self.positions > 2 * target:
            self.cache.fit(target)

    def _compact(self) -> None:
        """Decoding sequences into slots 0..n-1 (a prefilling one moved out of the way)."""
        n = len(self.decoding)
        for sequence in [s for s in self.decoding if s.slot >= n]:
            hole = min(i for i in range(n) if i not in {s.slot for s in self.decoding})
            holder = next((s for s in self.waiting if s.slot == hole), None)
            if holder is None:
                self._move(sequence, hole)
            else:  # a prefilling prompt holds the hole: the two change places
                self._swap(sequence, holder)

    def _move(self, sequence: Sequence, slot: int) -> None:
        self._free.discard(slot)
        self.cache.move(sequence.slot, slot, sequence.filled)
        self._free.add(sequence.slot)
        sequence.slot = slot

    def _swap(self, a: Sequence, b: Sequence) -> None:
        self.cache.swap(a.slot, a.filled, b.slot, b.filled)
        a.slot, b.slot = b.slot, a.slot

    def _run(
        self, first: int, end: int, ids: np.ndarray, past: np.ndarray,
        lengths: np.ndarray | None = None,
    ) -> np.ndarray:  # fmt: skip
        """One graph call for slots first..end-1, each row `past` positions in, its
        `lengths` of `ids` real (all of them by default; the rest right padding).
        The cache's 60 bindings are kept while the range and the buffers stay the
        same (most steps): binding them costs about 0.4 ms a step, a tenth of a
        decode step on a GPU; only the small host inputs are bound anew."""
        key = (first, end, self.cache.epoch)
        if key != self._bound:
            self._binding = self.session.io_binding()
            self._binding.bind_output("logits")
            self.cache.bind(self._binding, first, end)
            self._bound = key
        binding = self._binding
        binding.bind_cpu_input("input_ids", ids)
        made = ids.shape[1] if lengths is None else lengths
        binding.bind_cpu_input("seqlens_k", (past + made - 1).astype(np.int32))
        binding.bind_cpu_input(
            "total_sequence_length", np.array(int(past.max()) + ids.shape[1], np.int32)
        )
        self.session.run_with_iobinding(binding)
        logits: np.ndarray = binding.get_outputs()[0].numpy()
        return logits
