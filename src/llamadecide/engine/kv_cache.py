"""The KV cache's one owner: what every sequence holds, every cell's budget, and every evaluation.

Sequences: 0 holds the most recent prompt prefix, reused by the next call by longest common token
prefix; 1..`max_working` are working sequences (an answer trie's continuations) that live for one
call; the highest ids hold pinned prefixes (a question-first prompt format's question block, k-shot
demonstrations), kept across calls whatever runs in between; one more is scratch, for the rows that
pad a small call to a deterministic shape (`decoder.plan_calls`).

The cache is kept compact: used cells are always below free ones, pins lowest (in the order they
were evaluated), then sequence 0's own cells, then a call's working cells. llama.cpp fills free
cells from the lowest one a removal left, so every sequence's cells then lie in position order,
and a row's attention visits them in the same order whatever ran before: with the call shapes of
`decoder.plan_calls`, a prompt's numbers do not depend on server history. A removal that would leave a hole
(evicting a pin under another) drops what lies above it and evaluates the surviving pins again.

Room is made before anything is evaluated, so `llama_decode` never runs out of cells: first
sequence 0's cells a prompt does not reuse, then least-recently-used pins.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import llama_cpp
import numpy as np

from llamadecide.engine.decoder import MIN_CALL_ROWS, Decoder, Rows, plan_calls

PROMPT = 0


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class KVCache:
    def __init__(
        self,
        ctx: llama_cpp.llama_context_p,
        decoder: Decoder,
        *,
        n_ctx: int,
        n_seq_max: int,
        pinned_prefixes: int,
        pinned_cells: int,
        deterministic: bool,
        call_rows: int,
    ) -> None:
        self._memory = llama_cpp.llama_get_memory(ctx)
        self.decoder = decoder
        self.n_ctx = n_ctx
        self.deterministic = deterministic
        self.call_rows = call_rows  # the most rows one call holds (`decoder.max_call_rows`, or n_batch)
        self.scratch = n_seq_max - 1
        slots = max(0, min(pinned_prefixes, n_seq_max - 3))
        self._pin_ids = list(range(n_seq_max - 2, n_seq_max - 2 - slots, -1))
        self.max_working = n_seq_max - 2 - slots  # sequences 1..max_working
        self._pinned_cells_cap = pinned_cells if pinned_cells > 0 else n_ctx  # the setting: 0 is no cap
        self.prompt: list[int] = []  # tokens sequence 0 holds
        self._exact = 0  # how many of them were evaluated in deterministic calls (reusable for scoring)
        # How many of them hold every block; the cells past those were evaluated in calls stopped
        # early (a head's block) and hold `_shallow_blocks` blocks, enough for a read that deep only.
        self._deep = 0
        self._shallow_blocks = 0
        self._shared = 0  # how many of them are a pin's cells (tagged, not its own)
        self._pins: OrderedDict[tuple[int, ...], int] = OrderedDict()  # least recently used first
        self._stack: list[tuple[int, ...]] = []  # pins in cell order, lowest first
        self.last_reused = 0  # prompt tokens the last prepared prompt took from the cache

    # -- what is held ---------------------------------------------------------------------------

    @property
    def pinned(self) -> list[tuple[int, ...]]:
        """The pinned prefixes, least recently used first."""
        return list(self._pins)

    @property
    def pinned_cells_used(self) -> int:
        """The cells the pinned prefixes hold now (the cap is the setting `pinned_cells`)."""
        return sum(len(key) for key in self._pins)

    @property
    def used(self) -> int:
        return self.pinned_cells_used + len(self.prompt) - self._shared

    @property
    def free(self) -> int:
        return self.n_ctx - self.used

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)
        self.prompt, self._exact, self._shared, self._deep = [], 0, 0, 0
        self._pins.clear()
        self._stack.clear()

    # -- evaluation -------------------------------------------------------------------------------

    def run(
        self,
        rows: Rows,
        reads: dict[int, Sequence[int]] | None = None,
        hidden_row: int | None = None,
        layer: int | None = None,
    ) -> tuple[dict[int, dict[int, float]], np.ndarray | None]:
        """`evaluate` with at most one hidden state to read (of block `layer`, None: the final state)."""
        found, states = self.evaluate(rows, reads, {} if hidden_row is None else {hidden_row: layer})
        return found, states.get(hidden_row) if hidden_row is not None else None

    def evaluate(
        self,
        rows: Rows,
        reads: dict[int, Sequence[int]] | None = None,
        hidden_rows: Mapping[int, int | None] | None = None,
    ) -> tuple[dict[int, dict[int, float]], dict[int, np.ndarray]]:
        """Evaluate rows in the call shapes of `decoder.plan_calls`. reads: row index -> the tokens
        whose log-probability to read from that row's output. hidden_rows: rows whose hidden state
        to read (output rows, like the rows read) -> the block read (None: the final state). A call
        that reads no logits stops after the deepest state it reads: its rows' cells then lack the
        later blocks, so the caller must not keep them for a deeper call. The caller has made room."""
        reads = reads or {}
        wanted = dict(hidden_rows or {})
        marked = [output or i in wanted for i, output in enumerate(rows.outputs)]  # a hidden state is an output
        found: dict[int, dict[int, float]] = {}
        states: dict[int, np.ndarray] = {}
        for call in plan_calls(marked, deterministic=self.deterministic, limit=self.call_rows):
            span = range(call.start, call.end)
            outputs = [marked[i] or i in call.extra_outputs for i in span]
            tokens, positions = rows.tokens[call.start : call.end], rows.positions[call.start : call.end]
            seq_ids = rows.seq_ids[call.start : call.end]
            if call.padding:
                tokens = tokens + [tokens[0]] * call.padding
                positions = positions + list(range(call.padding))
                seq_ids = seq_ids + [(self.scratch,)] * call.padding
                outputs = outputs + [any(outputs)] * call.padding
            hidden = [i for i in span if i in wanted]
            try:
                self.decoder.decode(
                    tokens,
                    positions,
                    seq_ids,
                    outputs,
                    padding=call.padding,
                    hidden_rows={i - call.start: wanted[i] for i in hidden},
                    logits=any(i in reads for i in span),
                )
            except RuntimeError:
                self.clear()  # the cache's state is no longer known
                raise
            finally:
                if call.padding:
                    llama_cpp.llama_memory_seq_rm(self._memory, self.scratch, -1, -1)
            for i in span:
                if i in reads:
                    row = self.decoder.logprobs(i - call.start)
                    found[i] = {token: float(row[token]) for token in reads[i]}
            for i in hidden:
                states[i] = self.decoder.hidden(i - call.start)
        return found, states

    def decode_next(self, token: int) -> None:
        """Append one token to sequence 0 and compute its logits, in a call of its own (generation:
        fast, but not a deterministic shape, so sequence 0 is not reused for scoring past it)."""
        try:
            self.decoder.decode([token], [len(self.prompt)], [(PROMPT,)], [True])
        except RuntimeError:
            self.clear()
            raise
        self.prompt.append(token)

    def fill(self, tokens: Sequence[int], start: int, sequence: int) -> None:
        """Evaluate tokens[start:] into `sequence` at their own positions, no outputs."""
        rows = Rows()
        rows.extend(tokens[start:], start, (sequence,))
        self.run(rows)

    # -- the prompt sequence ----------------------------------------------------------------------

    def source(self, tokens: Sequence[int], layer: int | None = None) -> tuple[tuple[int, ...] | None, int]:
        """Where the longest reusable prefix of `tokens` is: sequence 0 (None) or a pin, and its length
        (sequence 0 prepares from it; working sequences share it), for work that reads up to block
        `layer` (None: every block). Deterministic scoring reuses only cells evaluated in
        deterministic calls."""
        limit = self._exact if self.deterministic else len(self.prompt)
        if layer is None or layer >= self._shallow_blocks:
            limit = min(limit, self._deep)
        best: tuple[tuple[int, ...] | None, int] = (None, common_prefix_length(self.prompt[:limit], tokens))
        for key in self._pins:
            length = common_prefix_length(key, tokens)
            if length > best[1]:
                best = (key, length)
        return best

    def make_room(self, tokens: Sequence[int], extra: int, layer: int | None = None) -> None:
        """Free enough cells for sequence 0 to hold `tokens` (reusing what it can) plus `extra` more
        cells (answer tries, working sequences), and the scratch rows of a padded call: first the
        cells of sequence 0 that `tokens` does not reuse (dropped when it is prepared), then
        least-recently-used pins, the one `tokens` reuses last."""
        while True:
            source, reuse = self.source(tokens, layer)
            kept = max(0, reuse - self._shared) if source is None else 0
            if len(tokens) - reuse + extra + MIN_CALL_ROWS <= self.n_ctx - self.pinned_cells_used - kept:
                return
            victims = [key for key in self._pins if key != source] or ([source] if source is not None else [])
            if not victims:
                return  # nothing left to give way: the caller checked that its work fits the context
            self._evict(victims[0])

    def prepare(self, tokens: Sequence[int], layer: int | None = None) -> int:
        """Make sequence 0 hold the longest prefix of `tokens` reusable by work reading up to block
        `layer` (None: every block) and nothing else; returns its length. The caller evaluates the
        rest into sequence 0 and records it with `extend`."""
        source, reuse = self.source(tokens, layer)
        if source is not None:
            llama_cpp.llama_memory_seq_rm(self._memory, PROMPT, -1, -1)
            llama_cpp.llama_memory_seq_cp(self._memory, self._pins[source], PROMPT, 0, reuse)
            self._pins.move_to_end(source)
            self.prompt, self._shared, self._deep = list(tokens[:reuse]), reuse, reuse
            self._exact = reuse if self.deterministic else 0
        elif reuse < len(self.prompt):
            self.trim(reuse)
        self.last_reused = reuse
        return reuse

    def extend(self, tokens: Sequence[int], layer: int | None = None) -> None:
        """Record that sequence 0 now also holds `tokens`, evaluated by `run` after what it held, up to
        block `layer` (a call stopped there) or through every block (None)."""
        if self._exact == len(self.prompt) and self.deterministic:
            self._exact += len(tokens)
        if layer is None:
            if self._deep == len(self.prompt):
                self._deep += len(tokens)
        elif self._deep == len(self.prompt):
            self._shallow_blocks = layer + 1
        else:
            self._shallow_blocks = min(self._shallow_blocks, layer + 1)
        self.prompt.extend(tokens)

    def prefill(self, tokens: Sequence[int], *, extra: int = 0) -> int:
        """Make sequence 0 hold exactly `tokens`, with room for `extra` more cells; returns how many
        came from the cache."""
        self.make_room(tokens, extra)
        reused = self.prepare(tokens)
        self.fill(tokens, reused, PROMPT)
        self.extend(tokens[reused:])
        return reused

    def trim(self, length: int) -> None:
        """Drop sequence 0's tokens from `length` on (cells at the top of the cache)."""
        if length < len(self.prompt):
            llama_cpp.llama_memory_seq_rm(self._memory, PROMPT, length, -1)
            del self.prompt[length:]
            self._shared = min(self._shared, length)
            self._exact = min(self._exact, length)
            self._deep = min(self._deep, length)

    @contextmanager
    def working(self, members: int, *, from_prompt: bool = True) -> Iterator[list[int]]:
        """Working sequences 1..members, each holding sequence 0's cells for the duration (on a
        unified cache a copy only tags cells), or nothing; removed afterwards with every cell only
        they hold (the top of the cache)."""
        if members > self.max_working:
            raise ValueError(f"at most {self.max_working} working sequences")
        ids = list(range(1, members + 1))
        for s in ids if from_prompt else ():
            llama_cpp.llama_memory_seq_cp(self._memory, PROMPT, s, -1, -1)
        try:
            yield ids
        finally:
            for s in ids:
                llama_cpp.llama_memory_seq_rm(self._memory, s, -1, -1)

    # -- many prompts at once -------------------------------------------------------------------

    def pin_cells(self, keys) -> int:
        return sum(len(key) for key in keys if key is not None)

    def make_working_room(self, cells: int, keep: set, *, prompt: int = 0) -> None:
        """Room for `cells` working cells (and a padded call's scratch rows) beside the pins in
        `keep` and sequence 0's first `prompt` tokens: sequence 0's other cells go first, then the
        rest of it, then least-recently-used pins not kept."""
        for length in (prompt, 0):
            if self.free >= cells + MIN_CALL_ROWS:
                return
            self.trim(length)
        for key in [k for k in self._pins if k not in keep]:
            if self.free >= cells + MIN_CALL_ROWS:
                return
            self._evict(key)

    def share(self, key: tuple[int, ...] | None, length: int, sequences: Sequence[int]) -> None:
        """Give each sequence the first `length` cells of a pin, or of sequence 0 (None); this tags
        cells, nothing is copied."""
        if key is not None:
            self._pins.move_to_end(key)
        for s in sequences:
            llama_cpp.llama_memory_seq_cp(self._memory, PROMPT if key is None else self._pins[key], s, 0, length)

    # -- pins -----------------------------------------------------------------------------------

    def pin(self, tokens: Sequence[int]) -> bool:
        """Keep `tokens` evaluated in a sequence of its own, so a later prompt that starts with them
        takes their cells from there even after other prompts ran in between. Any prefix that fits
        the context beside a small call is pinned (within `pinned_cells`, if set); least recently
        used pins give way. Returns whether it is pinned."""
        key = tuple(tokens)
        if key in self._pins:
            self._pins.move_to_end(key)
            return True
        if not self._pin_ids or not key or len(key) + MIN_CALL_ROWS > self.n_ctx or len(key) > self._pinned_cells_cap:
            return False
        while self._pins and (
            len(self._pins) == len(self._pin_ids) or self.pinned_cells_used + len(key) > self._pinned_cells_cap
        ):
            self._evict(next(iter(self._pins)))
        self.trim(self._shared)  # sequence 0's own cells lie above the pins: the new pin goes there
        while self._pins and self.free < len(key) + MIN_CALL_ROWS:
            self._evict(next(iter(self._pins)))
        if self.free < len(key) + MIN_CALL_ROWS:
            self.trim(0)
        self._evaluate_pin(key)
        return True

    def _evaluate_pin(self, key: tuple[int, ...]) -> None:
        sequence = next(s for s in self._pin_ids if s not in self._pins.values())
        self.fill(key, 0, sequence)
        self._pins[key] = sequence
        self._stack.append(key)

    def _evict(self, key: tuple[int, ...]) -> None:
        """Remove a pin. Sequence 0 and the pins evaluated after it go too (their cells lie above
        its cells, and a hole below them would be filled out of position order); those pins are
        evaluated again at once, in their order, keeping their place in the least-recently-used order."""
        order = [k for k in self._pins if k != key]
        above = self._stack[self._stack.index(key) + 1 :]
        self.trim(0)
        for k in [key, *above]:
            llama_cpp.llama_memory_seq_rm(self._memory, self._pins.pop(k), -1, -1)
            self._stack.remove(k)
        for k in above:
            self._evaluate_pin(k)
        self._pins = OrderedDict((k, self._pins[k]) for k in order)
