"""Stop strings found in a sequence's new bytes as they come, in time linear in the bytes
(Knuth-Morris-Pratt), however many bytes are held back and however many stop strings there are
(docs/sampling.md)."""

from __future__ import annotations


def failure_table(pattern: bytes) -> list[int]:
    """Knuth-Morris-Pratt's table: entry k is the length of the longest proper prefix of pattern[:k + 1]
    that is also a suffix of it (where a partial match can resume after a mismatch)."""
    table, k = [0] * len(pattern), 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = table[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        table[i] = k
    return table


class StopMatcher:
    """Finds the first of several stop strings in bytes fed piece by piece. For each stop string it
    keeps the length of its longest prefix that the bytes so far end with (Knuth-Morris-Pratt), so each
    new byte costs amortised O(1) per stop string, never a rescan of what was held back."""

    def __init__(self, stops: tuple[bytes, ...]):
        self.stops = stops
        self.tables = [failure_table(s) for s in stops]
        self.matched = [0] * len(stops)  # per stop string: the prefix of it the bytes end with
        self.length = 0  # bytes fed so far

    def feed(self, data: bytes, counting: bool = True) -> int | None:
        """Take the next bytes; the offset where the earliest stop string completed in them begins, or
        None. Not `counting` (within min_tokens), a stop string completed in them is passed over."""
        first = None
        for j, (stop, table) in enumerate(zip(self.stops, self.tables)):
            k = self.matched[j]
            for i, byte in enumerate(data):
                while k and stop[k] != byte:
                    k = table[k - 1]
                if stop[k] == byte:
                    k += 1
                if k == len(stop) and not counting:
                    k = table[k - 1]  # go on matching, as after a mismatch
                elif k == len(stop):  # this stop string's first occurrence: later ones begin later
                    start = self.length + i + 1 - k
                    first = start if first is None else min(first, start)
                    break
            self.matched[j] = k
        self.length += len(data)
        return first

    @property
    def open_from(self) -> int:
        """Where the bytes that could still begin a stop string start: everything before is final."""
        return self.length - max(self.matched)
