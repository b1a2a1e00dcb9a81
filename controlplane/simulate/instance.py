"""One engine instance stepping like a continuous-batching server: ``Instance``.

Owns the instance's queue and its running requests, and what one step does. Each step,
in vLLM v1's order: every decoding request takes one token of the step's token budget;
prompts being computed take the next chunk of what is left (chunked prefill); then
waiting requests start in arrival order while budget, running slots and the KV cache
allow (``controlplane.simulate.kv``: a request the cache cannot hold yet blocks the
queue behind it). A request's first token comes at the end of the step that completes
its prompt; it then decodes one token a step until it has produced its output tokens,
and its blocks are released and the cache trimmed at the end of that step.

A stretch with only decoding requests is one event, not one per step: its length comes
in closed form from the cost model and is cut short at the next step boundary when a
request arrives (``interrupt``). Times are simulated seconds; the policies see trace
seconds (simulated time x speed-up) so fitted rates keep their meaning under ``--speed``.

It must never route requests, read the trace file or summarise results.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from controlplane.simulate.cost import CostModel
from controlplane.simulate.kv import InstanceCache
from controlplane.simulate.profiles import Profile
from controlplane.simulate.requests import Outcomes, Workload


@dataclass(slots=True)
class Prefill:
    """A running request whose prompt is still being computed."""

    request: int
    remaining: int
    """Prompt tokens left to compute."""
    context: int
    """Tokens already in its KV (cached or computed)."""


@dataclass(slots=True)
class DecodeRun:
    """A stretch of decode-only steps that started at ``start``."""

    start: float
    running: int
    context: int
    steps: int


class Instance:
    """One engine instance (module docstring). ``step`` plans the next step and returns
    its duration (None: idle); ``finish_step`` applies it at its end."""

    def __init__(
        self,
        index: int,
        cache: InstanceCache,
        cost: CostModel,
        profile: Profile,
        work: Workload,
        out: Outcomes,
    ) -> None:
        self.index = index
        self.cache = cache
        self.cost = cost
        self.budget = profile.max_batch_tokens
        self.max_running = profile.max_running
        self.work = work
        self.out = out
        self.waiting: deque[int] = deque()
        self.prefills: list[Prefill] = []
        self._chunks: list[tuple[Prefill, int]] = []
        self._decoders: list[tuple[int, int, int]] = []  # (finish step, request, context)
        self.decoding = 0
        self.decode_context = 0
        self.steps_done = 0
        self.run: DecodeRun | None = None
        self.busy = False
        self.version = 0
        """Bumped whenever the planned end of the current step changes."""

    @property
    def load(self) -> int:
        """Requests queued or running here."""
        return len(self.waiting) + len(self.prefills) + self.decoding

    def step(self, now: float) -> float | None:
        """Plan the step starting at ``now``; its duration, or None when idle."""
        self.version += 1
        budget = self.budget - self.decoding
        chunks: list[tuple[Prefill, int]] = []
        for pf in self.prefills:
            if budget <= 0:
                break
            n = min(pf.remaining, budget)
            chunks.append((pf, n))
            budget -= n
        while budget > 0 and self.waiting and len(self.prefills) + self.decoding < self.max_running:
            started = self._start(self.waiting[0], now)
            if started is None:
                break
            self.waiting.popleft()
            self.prefills.append(started)
            n = min(started.remaining, budget)
            chunks.append((started, n))
            budget -= n
        if not chunks:
            return self._decode_run(now)
        new_tokens, pairs, kv_tokens = (
            self.decoding,
            float(self.decode_context),
            self.decode_context,
        )
        for pf, n in chunks:
            new_tokens += n
            pairs += self.cost.chunk_pairs(n, pf.context)
            kv_tokens += pf.context + n
        self._chunks = chunks
        self.run = None
        self.busy = True
        return self.cost.step_seconds(new_tokens, pairs, kv_tokens)

    def _start(self, r: int, now: float) -> Prefill | None:
        """Start request ``r`` if the cache can hold it (always when nothing runs)."""
        cache = self.cache
        lookup = cache.lookup(r)
        if (self.prefills or self.decoding) and not cache.fits(lookup):
            return None
        cache.admit(r, lookup, self.work.trace_time(now))
        prompt = self.work.prompt_tokens[r]
        # At least one prompt token is computed (it yields the first token); a prompt of
        # none (a request with no blocks, from the Python API) has nothing cached.
        cached = max(0, min(lookup.hits * self.work.block_tokens, prompt - 1))
        out = self.out
        out.instance[r] = self.index
        out.hit_blocks[r] = lookup.hits
        out.cached_tokens[r] = cached
        out.started[r] = now
        return Prefill(r, prompt - cached, cached)

    def _decode_run(self, now: float) -> float | None:
        if not self.decoding:
            self.busy = False
            self.run = None
            self._chunks = []
            return None
        steps = self._decoders[0][0] - self.steps_done
        self.run = DecodeRun(now, self.decoding, self.decode_context, steps)
        self._chunks = []
        self.busy = True
        return self.cost.decode_seconds(self.decoding, self.decode_context, steps)

    def interrupt(self, now: float) -> float | None:
        """A request arrived during a decode-only stretch: end it at the next step
        boundary. Returns the new end, or None when nothing changes."""
        run = self.run
        if run is None or not self.busy:
            return None
        done = self.cost.decode_steps_within(run.running, run.context, now - run.start)
        steps = min(done + 1, run.steps)
        if steps == run.steps:
            return None
        self.version += 1
        run.steps = steps
        return run.start + self.cost.decode_seconds(run.running, run.context, steps)

    def finish_step(self, now: float) -> None:
        """The planned step (or decode stretch) ends at ``now``: apply it."""
        steps = self.run.steps if self.run is not None else 1
        self.steps_done += steps
        self.decode_context += self.decoding * steps
        finished = False
        decoders = self._decoders
        while decoders and decoders[0][0] <= self.steps_done:
            _, r, context = heapq.heappop(decoders)
            self.decoding -= 1
            self.decode_context -= context + (self.work.output_tokens[r] - 1)
            self._finish(r, now)
            finished = True
        for pf, n in self._chunks:
            pf.remaining -= n
            pf.context += n
            if pf.remaining == 0:
                finished |= self._first_token(pf, now)
        if self._chunks:
            self.prefills = [pf for pf in self.prefills if pf.remaining]
        self._chunks = []
        self.run = None
        self.busy = False
        if finished:
            self.cache.trim()

    def _first_token(self, pf: Prefill, now: float) -> bool:
        """The prompt of ``pf`` is computed: its first token. True if it also finished."""
        r = pf.request
        self.out.first_token[r] = now
        self.cache.computed(r)
        more = self.work.output_tokens[r] - 1
        if more <= 0:
            self._finish(r, now)
            return True
        context = pf.context + 1
        heapq.heappush(self._decoders, (self.steps_done + more, r, context))
        self.decoding += 1
        self.decode_context += context
        return False

    def _finish(self, r: int, now: float) -> None:
        # Blocks are stamped with the time the request looked them up, as the replay
        # stamps them with its arrival; wa stamps a late release with its clock.
        self.out.finished[r] = now
        self.cache.release(r, self.work.trace_time(float(self.out.started[r])))
