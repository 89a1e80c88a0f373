"""A token trie over continuations: shared prefixes are evaluated once (pure logic)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class TrieNode:
    token: int
    depth: int  # 0 for the root (the last prompt token)
    parent: int  # index of the parent node, -1 for the root
    members: list[int] = field(default_factory=list)  # continuation indices passing through
    children: dict[int, int] = field(default_factory=dict)  # token -> node index


def build_trie(root_token: int, continuations: Sequence[Sequence[int]]) -> list[TrieNode]:
    """Nodes in breadth-first order (parents before children, depth non-decreasing), so that
    every continuation's tokens appear at consecutive positions in increasing order."""
    nodes = [TrieNode(token=root_token, depth=0, parent=-1, members=list(range(len(continuations))))]
    for index, tokens in enumerate(continuations):
        current = 0
        for token in tokens:
            child = nodes[current].children.get(token)
            if child is None:
                child = len(nodes)
                nodes.append(TrieNode(token=token, depth=nodes[current].depth + 1, parent=current))
                nodes[current].children[token] = child
            nodes[child].members.append(index)
            current = child
    order = sorted(range(len(nodes)), key=lambda i: (nodes[i].depth, i))
    remap = {old: new for new, old in enumerate(order)}
    ordered: list[TrieNode] = []
    for old in order:
        node = nodes[old]
        ordered.append(
            TrieNode(
                token=node.token,
                depth=node.depth,
                parent=remap[node.parent] if node.parent >= 0 else -1,
                members=node.members,
                children={tok: remap[c] for tok, c in node.children.items()},
            )
        )
    return ordered


def continuation_paths(nodes: Sequence[TrieNode], continuations: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each continuation, the node index that predicts each of its tokens (the parent of
    the node holding that token)."""
    paths: list[list[int]] = []
    for tokens in continuations:
        current = 0
        predictors: list[int] = []
        for token in tokens:
            predictors.append(current)
            current = nodes[current].children[token]
        paths.append(predictors)
    return paths


def plan_groups(continuations: Sequence[Sequence[int]], *, max_members: int, max_nodes: int) -> list[list[int]]:
    """Split continuations into groups that each fit the engine at once: at most `max_members`
    continuations (one KV sequence each) and at most `max_nodes` trie nodes (KV cells and batch
    rows, root included). Order is kept; a continuation that alone exceeds `max_nodes` is the
    caller's error to report before planning."""
    groups: list[list[int]] = []
    current: list[int] = []
    trie: dict = {}
    nodes = 1
    for index, tokens in enumerate(continuations):
        new_nodes = _count_new(trie, tokens)
        if current and (len(current) >= max_members or nodes + new_nodes > max_nodes):
            groups.append(current)
            current, trie, nodes = [], {}, 1
            new_nodes = len(tokens)
        _insert(trie, tokens)
        nodes += new_nodes
        current.append(index)
    if current:
        groups.append(current)
    return groups


def _count_new(trie: dict, tokens: Sequence[int]) -> int:
    level = trie
    for depth, token in enumerate(tokens):
        if token not in level:
            return len(tokens) - depth
        level = level[token]
    return 0


def _insert(trie: dict, tokens: Sequence[int]) -> None:
    level = trie
    for token in tokens:
        level = level.setdefault(token, {})


def trie_rows(continuations: Sequence[Sequence[int]]) -> int:
    """Batch rows (and KV cells) a trie evaluation of these continuations needs: its inner nodes,
    root included. A leaf, a continuation's last token, is never evaluated: nothing reads its
    output or attends to it."""
    prefixes = {tuple(tokens[:i]) for tokens in continuations for i in range(len(tokens))}
    return max(len(prefixes), 1)


def gather(
    nodes: Sequence[TrieNode], continuations: Sequence[Sequence[int]], expanded: dict[int, dict[int, float]]
) -> list[np.ndarray]:
    """Each continuation's token log-probabilities from the expanded nodes (NaN where the node
    predicting a token was not expanded)."""
    out = []
    for path, tokens in zip(continuation_paths(nodes, continuations), continuations):
        out.append(np.array([expanded[p][tok] if p in expanded else np.nan for p, tok in zip(path, tokens)]))
    return out


def frontier(nodes: Sequence[TrieNode], expanded: dict[int, dict[int, float]]) -> tuple[list[tuple[int, float]], float]:
    """The unexpanded nodes with children whose parent is expanded, with their prefix probability;
    and the total probability of the continuations that are complete (leaves under expanded nodes)."""
    logmass = {0: 0.0}
    found: list[tuple[int, float]] = []
    complete = 0.0
    for index, node in enumerate(nodes):  # parents come before children
        if index not in logmass:
            continue
        if index != 0 and not node.children:
            complete += float(np.exp(logmass[index]))
        elif index in expanded:
            for token, child in node.children.items():
                logmass[child] = logmass[index] + expanded[index][token]
        else:
            found.append((index, float(np.exp(logmass[index]))))
    return found, complete


def subtree(nodes: Sequence[TrieNode], start: int) -> list[int]:
    found, stack = [], [start]
    while stack:
        index = stack.pop()
        found.append(index)
        stack.extend(nodes[index].children.values())
    return found
