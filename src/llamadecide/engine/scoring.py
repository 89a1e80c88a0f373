"""Scoring continuations of a prompt as a token trie: exact, best-first under a bound, with the
hidden state the prompt ends in; and the from-scratch reference paths the benchmarks compare with.

A trie's rows are the prompt tokens the cache lacks, each belonging to sequence 0 and to every
continuation's working sequence, then the trie's inner nodes in breadth-first order, each belonging
to the continuations passing through it (llama.cpp masks attention per sequence and position, so
every continuation sees exactly the prompt and its own path, and a shared prefix is evaluated
once). Logits are read at every inner node; a continuation's token j is scored from its parent's row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from llamadecide.engine.decoder import MIN_CALL_ROWS, Rows
from llamadecide.engine.kv_cache import PROMPT, KVCache
from llamadecide.engine.trie import build_trie, frontier, gather, plan_groups, subtree, trie_rows
from llamadecide.engine.values import TrieScores
from llamadecide.errors import ContextOverflowError, InvalidRequestError


def max_sequence(n_ctx: int) -> int:
    """The longest prompt with its answer the engine scores: the context less the cells a padded
    call's scratch rows may need (`decoder.plan_calls`)."""
    return n_ctx - MIN_CALL_ROWS


def check_fits(n_ctx: int, n_tokens: int, what: str) -> None:
    if n_tokens > max_sequence(n_ctx):
        raise ContextOverflowError(
            f"{what} needs {n_tokens} tokens but the context holds {n_ctx} (of which "
            f"{max_sequence(n_ctx)} for a prompt with its answer; shorten the input or raise "
            f"n_ctx)",
            param="input",
        )


class Scorer:
    def __init__(self, kv: KVCache, *, call_cost_rows: int) -> None:
        self.kv = kv
        self.call_cost_rows = call_cost_rows

    def score_trie(
        self,
        prefix: Sequence[int],
        continuations: Sequence[Sequence[int]],
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
        max_bound: float = 0.0,
    ) -> TrieScores:
        if not prefix:
            raise InvalidRequestError("the prompt is empty")
        if not continuations or any(len(c) == 0 for c in continuations):
            raise InvalidRequestError("every continuation needs at least one token")
        if max_bound < 0:
            raise InvalidRequestError("max_bound must not be negative", param="epsilon")
        kv = self.kv
        check_fits(kv.n_ctx, len(prefix) + max(len(c) for c in continuations), "the prompt with its longest answer")
        budget = kv.n_ctx - (len(prefix) - 1) - MIN_CALL_ROWS
        groups = plan_groups(continuations, max_members=kv.max_working, max_nodes=budget)
        if max_bound > 0 and len(groups) == 1:
            nodes = build_trie(prefix[-1], continuations)
            if sum(1 for n in nodes if n.children) >= self.call_cost_rows:
                kv.make_room(prefix[:-1], trie_rows(continuations))
                cached = kv.prepare(prefix[:-1])
                rows, state = self._score_best_first(prefix, continuations, nodes, max_bound, hidden, hidden_layer)
                return TrieScores(rows, state, best_first=True, cached_tokens=cached)
        results: list[np.ndarray] = [np.empty(0)] * len(continuations)
        state, cached = None, 0
        for number, group in enumerate(groups):
            members = [continuations[i] for i in group]
            kv.make_room(prefix[:-1], trie_rows(members))
            reused = kv.prepare(prefix[:-1])
            cached = reused if number == 0 else cached
            scored, group_state = self._score_group(
                prefix, members, hidden=hidden and number == 0, hidden_layer=hidden_layer
            )
            state = group_state if number == 0 else state
            for i, values in zip(group, scored):
                results[i] = values
        if hidden and state is None:
            state = self.hidden_state(prefix, hidden_layer)  # the prefix is cached now: one row
        return TrieScores(results, state, cached_tokens=cached)

    def _tail_rows(self, prefix: Sequence[int], members: list[int]) -> Rows:
        """The prefix tokens sequence 0 lacks but the last, in sequence 0 and every member's sequence."""
        start = len(self.kv.prompt)
        rows = Rows()
        rows.extend(prefix[start:-1], start, (PROMPT, *members))
        return rows

    def _score_group(
        self, prefix: Sequence[int], continuations: Sequence[Sequence[int]], *, hidden: bool, hidden_layer: int | None
    ) -> tuple[list[np.ndarray], np.ndarray | None]:
        nodes = build_trie(prefix[-1], continuations)
        base = len(prefix) - 1
        with self.kv.working(len(continuations)) as ids:
            rows = self._tail_rows(prefix, ids)
            tail = len(rows)
            reads = {}
            for index, node in enumerate(nodes):
                if node.children:  # a leaf's output is never read and nothing attends to it: not evaluated
                    reads[index] = node.children
                    rows.add(node.token, base + node.depth, [ids[m] for m in node.members], output=True)
            inner = list(reads)
            found, state = self.kv.run(
                rows,
                {tail + r: reads[i] for r, i in enumerate(inner)},
                hidden_row=tail if hidden else None,
                layer=hidden_layer,
            )
        self.kv.extend(prefix[len(self.kv.prompt) : -1])
        return gather(nodes, continuations, {i: found[tail + r] for r, i in enumerate(inner)}), state

    def _score_best_first(
        self,
        prefix: Sequence[int],
        continuations: Sequence[Sequence[int]],
        nodes: list,
        max_bound: float,
        hidden: bool,
        hidden_layer: int | None,
    ) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Best-first trie evaluation with a certified bound. Call one evaluates the prefix's tail
        and the root (every continuation's first token). Each further call expands the unexpanded
        nodes of highest prefix probability, each with its whole subtree (so its continuations
        complete in that call), until the prefix probability left on the frontier is at most
        `max_bound` times the probability of the completed continuations: every continuation under
        the frontier is at most its frontier node's probability, so together they hold at most
        that much. After two such calls the rest is expanded whole (exact)."""
        base = len(prefix) - 1
        expanded: dict[int, dict[int, float]] = {}
        with self.kv.working(len(continuations)) as ids:
            rows = self._tail_rows(prefix, ids)
            tail = len(rows)
            rows.add(nodes[0].token, base, [ids[m] for m in nodes[0].members], output=True)
            found, state = self.kv.run(
                rows, {tail: nodes[0].children}, hidden_row=tail if hidden else None, layer=hidden_layer
            )
            self.kv.extend(prefix[len(self.kv.prompt) : -1])
            expanded[0] = found[tail]
            taken = 0.0
            for round_number in range(3):
                front, complete_mass = frontier(nodes, expanded)
                frontier_mass = sum(mass for _, mass in front)
                if not front or frontier_mass <= max_bound * complete_mass:
                    break
                if round_number == 2:
                    chosen = [index for index, _ in front]
                else:
                    # How much of an expanded node's prefix probability earlier calls found in its
                    # options (the rest goes to text that is no option): the share to expect now.
                    share = min(1.0, complete_mass / taken) if taken > 0 else 1.0
                    chosen, left = [], frontier_mass
                    for index, mass in sorted(front, key=lambda item: -item[1]):
                        if left <= max_bound * (complete_mass + share * (frontier_mass - left)):
                            break
                        chosen.append(index)
                        left -= mass
                    taken += frontier_mass - left
                inner = sorted(i for start in chosen for i in subtree(nodes, start) if nodes[i].children)
                rows = Rows()
                for i in inner:
                    rows.add(nodes[i].token, base + nodes[i].depth, [ids[m] for m in nodes[i].members], output=True)
                found, _ = self.kv.run(rows, {r: nodes[i].children for r, i in enumerate(inner)})
                for r, i in enumerate(inner):
                    expanded[i] = found[r]
        return gather(nodes, continuations, expanded), state

    def hidden_state(self, prompt: Sequence[int], layer: int | None = None) -> np.ndarray:
        """The model's hidden state at the prompt's last token (the position the answer is predicted
        from): the output of block `layer`, or with None the final one (after the output norm, before
        the vocabulary projection). Sequence 0 holds the whole prompt afterwards (after a block's
        state, its new cells only that deep: `KVCache.extend`)."""
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        kv = self.kv
        check_fits(kv.n_ctx, len(prompt), "the prompt")
        kv.make_room(prompt, 0, layer)
        kv.prepare(prompt[:-1], layer)
        start = len(kv.prompt)
        rows = Rows()
        rows.extend(prompt[start:], start, (PROMPT,))
        rows.outputs[-1] = True
        _, state = kv.run(rows, hidden_row=len(rows) - 1, layer=layer)
        kv.extend(prompt[start:], layer)
        assert state is not None
        return state

    def score_naive(self, tokens: Sequence[int], start: int, *, displaced: bool = False) -> np.ndarray:
        """Reference path: evaluate `tokens` from an empty cache and return the log-probability of
        each token from index `start` on. One full evaluation per call; used to check the batched
        path and as the benchmark's baseline. `displaced`: behind one unrelated cell (the first token
        in another sequence, masked), so every cell lies one index higher than from scratch."""
        if not 1 <= start < len(tokens):
            raise InvalidRequestError("start must fall inside the token sequence")
        check_fits(self.kv.n_ctx, len(tokens) + int(displaced), "the sequence")
        self.kv.clear()
        try:
            if displaced:
                self.kv.fill(tokens[:1], 0, self.kv.scratch - 1)
            rows = Rows()
            rows.extend(tokens, 0, (PROMPT,))
            reads = {p: (tokens[p + 1],) for p in range(start - 1, len(tokens) - 1)}
            for p in reads:
                rows.outputs[p] = True
            found, _ = self.kv.run(rows, reads)
            return np.array([found[p][tokens[p + 1]] for p in sorted(reads)])
        finally:
            self.kv.clear()

    def prompt_seconds(self, tokens: Sequence[int]) -> float:
        """Evaluate a prompt from an empty cache in the engine's call shapes, reading the last
        position's logits, and return the seconds it took (the benchmark's prompt-only baseline)."""
        check_fits(self.kv.n_ctx, len(tokens), "the prompt")
        self.kv.clear()
        began = time.perf_counter()
        rows = Rows()
        rows.extend(tokens, 0, (PROMPT,))
        rows.outputs[-1] = True
        self.kv.run(rows, {len(tokens) - 1: (tokens[-1],)})
        elapsed = time.perf_counter() - began
        self.kv.clear()
        return elapsed
