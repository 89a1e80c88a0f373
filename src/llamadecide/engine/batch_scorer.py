"""Many prompts per call: several inputs' prompt tails, their hidden states and their answer
tries evaluated in the same llama_decode calls, each on working sequences of its own that share a
pinned prefix by reference. In the engine's deterministic call shapes every row's numbers are its
own, so each input's scores equal those it gets alone (`Scorer.score_trie`, `Scorer.hidden_state`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llamadecide.engine.decoder import MIN_CALL_ROWS, Rows
from llamadecide.engine.kv_cache import KVCache, common_prefix_length
from llamadecide.engine.scoring import Scorer, check_fits
from llamadecide.engine.trie import build_trie, gather, trie_rows
from llamadecide.engine.values import ScoringInput, TrieScores
from llamadecide.errors import InvalidRequestError


@dataclass
class _Planned:
    index: int
    work: ScoringInput
    source: tuple[int, ...] | None
    reuse: int
    cells: int
    ids: list[int] = field(default_factory=list)


def _prompt_read(group: list[_Planned]) -> int:
    """How many of sequence 0's tokens the group reads."""
    return max((p.reuse for p in group if p.source is None), default=0)


class BatchScorer:
    def __init__(self, kv: KVCache, scorer: Scorer) -> None:
        self.kv = kv
        self.scorer = scorer

    def score_many(self, inputs: Sequence[ScoringInput]) -> list[TrieScores]:
        """Every input's scores, in order; as many inputs per group of calls as the working sequences,
        the KV cells and one call's rows allow. An input too large to share (more continuations than
        working sequences, or more cells than the context) is scored alone."""
        kv = self.kv
        results: list[TrieScores | None] = [None] * len(inputs)
        group: list[_Planned] = []
        for index, work in enumerate(inputs):
            self._check(work)
            planned = self._locate(_Planned(index, work, None, 0, 0))
            if work.members > kv.max_working or self._cells([planned]) + MIN_CALL_ROWS > kv.n_ctx:
                results[index] = self._alone(work)
                continue
            if group and not self._fits(group + [planned]):
                self._run(group, results)
                group = [self._locate(planned)]  # the group before may have left sequence 0 a prefix
            else:
                group.append(planned)
        if group:
            self._run(group, results)
        return [result for result in results if result is not None]  # every input has one

    def _locate(self, p: _Planned) -> _Planned:
        """Where the input's prompt can start from (a pin or sequence 0), and the cells it adds."""
        p.source, p.reuse = self.kv.source(
            p.work.prefix[:-1], p.work.hidden_layer if not p.work.continuations else None
        )
        p.cells = len(p.work.prefix) - 1 - p.reuse + (trie_rows(p.work.continuations) if p.work.continuations else 1)
        return p

    def _cells(self, group: list[_Planned]) -> int:
        """Cells the group needs: its own, the pins it reads and what it reads of sequence 0."""
        return sum(p.cells for p in group) + self.kv.pin_cells({p.source for p in group}) + _prompt_read(group)

    def _check(self, work: ScoringInput) -> None:
        if not work.prefix:
            raise InvalidRequestError("the prompt is empty")
        if any(len(c) == 0 for c in work.continuations):
            raise InvalidRequestError("every continuation needs at least one token")
        longest = max((len(c) for c in work.continuations), default=0)
        check_fits(self.kv.n_ctx, len(work.prefix) + longest, "the prompt with its longest answer")

    def _fits(self, group: list[_Planned]) -> bool:
        """Room for the group, and its rows in one call: sharing saves each call's fixed cost, and
        once a call is full, more inputs beside it only lengthen what every row scans (llama.cpp's
        attention visits every cell of the call, other sequences' included)."""
        members = sum(p.work.members for p in group)
        return (
            members <= self.kv.max_working
            and self._cells(group) + MIN_CALL_ROWS <= self.kv.n_ctx
            and sum(p.cells for p in group) <= self.kv.call_rows
        )

    def _alone(self, work: ScoringInput) -> TrieScores:
        if work.continuations:
            return self.scorer.score_trie(
                work.prefix, work.continuations, hidden=work.hidden, hidden_layer=work.hidden_layer
            )
        state = self.scorer.hidden_state(work.prefix, work.hidden_layer)
        return TrieScores([], state, cached_tokens=self.kv.last_reused)

    def _share_common_prefix(self, group: list[_Planned]) -> None:
        """Evaluate the group's common prompt prefix once, into sequence 0, when that saves more rows
        than a call costs (state-first prompts share their chat header, not a pin). Sequence 0's
        cells are evaluated in the same deterministic calls as any prompt's, so every input's rows
        are the same as when it runs alone."""
        if len(group) < 2:
            return
        first = group[0].work.prefix[:-1]
        common = min(common_prefix_length(first, p.work.prefix[:-1]) for p in group[1:])
        _, held = self.kv.source(first[:common])
        saved = sum(max(0, common - p.reuse) for p in group) - (common - held)
        if saved > self.scorer.call_cost_rows:
            self.kv.prefill(first[:common], extra=sum(p.cells for p in group))

    def _run(self, group: list[_Planned], results: list[TrieScores | None]) -> None:
        if len(group) == 1:  # alone, its prompt stays in sequence 0 for the next input to reuse
            results[group[0].index] = self._alone(group[0].work)
            return
        kv = self.kv
        cached = {p.index: p.reuse for p in group}  # before this group evaluated anything for itself
        self._share_common_prefix(group)
        for p in group:  # evaluating and making room move what pins and sequence 0 hold: look again
            self._locate(p)
        kv.make_working_room(sum(p.cells for p in group), {p.source for p in group}, prompt=_prompt_read(group))
        for p in group:
            self._locate(p)
        if kv.free < sum(p.cells for p in group) + MIN_CALL_ROWS:  # room was made by dropping what they read
            for p in group:
                results[p.index] = self._alone(p.work)
            return
        with kv.working(sum(p.work.members for p in group), from_prompt=False) as ids:
            start = 0
            for p in group:
                p.ids, start = ids[start : start + p.work.members], start + p.work.members
                if p.reuse:
                    kv.share(p.source, p.reuse, p.ids)
            # Every input's prompt tail first, then every last prompt token and answer trie.
            rows = Rows()
            for p in group:
                rows.extend(p.work.prefix[p.reuse : -1], p.reuse, p.ids)
            reads: dict[int, dict[int, int]] = {}
            hidden_rows: dict[int, int] = {}  # work index -> row
            node_rows: dict[int, tuple[list, dict[int, int]]] = {}  # work index -> (trie, node -> row)
            for p in group:
                base = len(p.work.prefix) - 1
                if not p.work.continuations:
                    hidden_rows[p.index] = rows.add(p.work.prefix[-1], base, p.ids, output=True)
                    continue
                trie = build_trie(p.work.prefix[-1], p.work.continuations)
                placed = {}
                for i, node in enumerate(trie):
                    if node.children:
                        placed[i] = rows.add(
                            node.token, base + node.depth, [p.ids[m] for m in node.members], output=True
                        )
                        reads[placed[i]] = node.children
                if p.work.hidden:
                    hidden_rows[p.index] = placed[0]
                node_rows[p.index] = (trie, placed)
            layer = {p.index: p.work.hidden_layer for p in group}
            layers = {row: layer[index] for index, row in hidden_rows.items()}
            found, states = kv.evaluate(rows, reads, layers)
        for p in group:
            state = states[hidden_rows[p.index]] if p.index in hidden_rows else None
            scored: list = []
            if p.index in node_rows:
                trie, placed = node_rows[p.index]
                scored = gather(trie, p.work.continuations, {i: found[row] for i, row in placed.items()})
            results[p.index] = TrieScores(scored, state, cached_tokens=min(cached[p.index], p.reuse))
