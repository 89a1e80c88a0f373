"""Fits already made, by a digest of their inputs (selection refits the same thing many times)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

import numpy as np

T = TypeVar("T")


class FitMemo:
    """Fits already made, by a digest of their inputs. Selection refits the same thing many times: a
    head's logistic regression for each lexical variant of a candidate, a lexical expert for each C
    (and both again in the inner folds of the mix). A fit is a pure function of its inputs, so the
    memo changes no result; it is bounded (least recently used out) and thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[bytes, object] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: bytes, make: Callable[[], T]) -> T:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]  # type: ignore[return-value]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


def digest(*parts: object) -> bytes:
    """A digest of arrays, texts and numbers, for `FitMemo` keys."""
    h = hashlib.blake2b(digest_size=20)
    for part in parts:
        if isinstance(part, np.ndarray):
            array = np.ascontiguousarray(part)
            h.update(f"{array.dtype.str}{array.shape}".encode())
            h.update(array.data)
        elif isinstance(part, (list, tuple)):
            h.update(f"[{len(part)}]".encode())
            for item in part:
                h.update(str(item).encode("utf-8", "surrogatepass") + b"\x00")
        else:
            h.update(repr(part).encode())
        h.update(b"|")
    return h.digest()
