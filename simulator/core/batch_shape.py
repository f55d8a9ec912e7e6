"""`BatchShape`: the aggregate shape of one engine step, all a cost model needs.

The scheduler fills it while it schedules (a few additions per request), so
neither the cost model nor the simulator has to walk the batch again.
A request is a *decode* when it computes exactly one new token on top of a
non-empty context; everything else (prompt chunks, recomputes) is *prefill*.

With `window` > 0 (the model's sliding window, tokens) the shape also sums what a
sliding-window layer reads: a query at position p attends to keys max(0, p - window + 1)
.. p, i.e. min(p + 1, window) of them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class BatchShape:
    """Aggregates over the requests scheduled in one step (all counts in tokens)."""

    num_reqs: int = 0
    num_tokens: int = 0  # new tokens computed this step (prefill + decode)
    num_decode_reqs: int = 0
    decode_context_tokens: int = 0  # sum over decodes of context incl. the new token (KV read)
    num_prefill_reqs: int = 0
    num_prefill_tokens: int = 0  # sum over prefills of new (query) tokens
    prefill_context_tokens: int = 0  # sum over prefills of context before + new (KV read)
    prefill_attn_pairs: int = 0  # sum over prefills of causal query-key pairs
    max_context: int = 0  # longest context incl. new tokens in this step
    max_decode_context: int = 0  # longest decode context incl. the new token
    # ---- sliding-window layers (tracked only when window > 0) ----
    window: int = 0  # tokens a sliding layer attends to (0: no sliding layers tracked)
    decode_window_tokens: int = 0  # sum over decodes of min(context incl. new token, window)
    num_decodes_below_window: int = 0  # decodes whose context is < window (it grows next step)
    min_window_gap: int = 0  # min over those of window - context (0 when there are none)
    prefill_window_context_tokens: int = 0  # sum over prefills of keys a sliding layer reads
    prefill_window_pairs: int = 0  # sum over prefills of query-key pairs within the window

    def add(self, num_new_tokens: int, num_context_before: int) -> None:
        """Add one request computing `num_new_tokens` after `num_context_before` cached tokens."""
        total = num_context_before + num_new_tokens
        self.num_reqs += 1
        self.num_tokens += num_new_tokens
        if num_new_tokens == 1 and num_context_before > 0:
            self.num_decode_reqs += 1
            self.decode_context_tokens += total
            if total > self.max_decode_context:
                self.max_decode_context = total
        else:
            self.num_prefill_reqs += 1
            self.num_prefill_tokens += num_new_tokens
            self.prefill_context_tokens += total
            # query i (0-based) attends to num_context_before + i + 1 keys
            self.prefill_attn_pairs += num_new_tokens * num_context_before + (
                num_new_tokens * (num_new_tokens + 1)
            ) // 2
            if self.window:
                self._add_window_prefill(num_new_tokens, num_context_before)
        if total > self.max_context:
            self.max_context = total
        if self.window and num_new_tokens == 1 and num_context_before > 0:
            self.add_window_decode(total)

    def add_window_decode(self, context: int) -> None:
        """Sliding-window sums of one decode whose context incl. the new token is `context`."""
        w = self.window
        if context < w:
            self.decode_window_tokens += context
            gap = w - context
            if not self.num_decodes_below_window or gap < self.min_window_gap:
                self.min_window_gap = gap
            self.num_decodes_below_window += 1
        else:
            self.decode_window_tokens += w

    def _add_window_prefill(self, q: int, c: int) -> None:
        """Sliding-window sums of a chunk of `q` queries after `c` cached tokens: query i
        sees min(c + i + 1, window) keys; the layer reads keys max(0, c - window + 1) .. c + q - 1."""
        w = self.window
        self.prefill_window_context_tokens += min(c + q, q + w - 1)
        lo, hi = c + 1, c + q  # keys seen by the first and the last query, uncapped
        if hi <= w:
            pairs = (lo + hi) * q // 2
        elif lo >= w:
            pairs = q * w
        else:
            pairs = (lo + w) * (w - lo + 1) // 2 + (hi - w) * w
        self.prefill_window_pairs += pairs

    def add_decodes(self, num_reqs: int, context_tokens: int, max_context: int) -> None:
        """Add `num_reqs` decodes (one new token each after a non-empty context) whose
        contexts incl. the new token sum to `context_tokens`, the longest `max_context`."""
        self.num_reqs += num_reqs
        self.num_tokens += num_reqs
        self.num_decode_reqs += num_reqs
        self.decode_context_tokens += context_tokens
        if max_context > self.max_decode_context:
            self.max_decode_context = max_context
        if max_context > self.max_context:
            self.max_context = max_context

    @classmethod
    def from_lists(cls, num_new_tokens: list[int], num_context_before: list[int],
                   window: int = 0) -> BatchShape:
        shape = cls(window=window)
        for q, c in zip(num_new_tokens, num_context_before, strict=True):
            shape.add(q, c)
        return shape

    def advanced(self, steps: int) -> BatchShape:
        """The shape of this all-decode batch `steps` steps later (each context grew by `steps`).
        With a window, only while no context below it reaches it (`steps < min_window_gap`):
        the sums capped at the window cannot be told apart beyond that."""
        if self.num_prefill_reqs:
            raise ValueError("advanced() is only defined for all-decode batches")
        if self.num_decodes_below_window and steps >= self.min_window_gap:
            raise ValueError(f"advanced({steps}): a decode context reaches the sliding window "
                             f"after {self.min_window_gap} steps")
        below = self.num_decodes_below_window
        return BatchShape(
            num_reqs=self.num_reqs,
            num_tokens=self.num_tokens,
            num_decode_reqs=self.num_decode_reqs,
            decode_context_tokens=self.decode_context_tokens + steps * self.num_decode_reqs,
            max_context=self.max_context + steps,
            max_decode_context=self.max_decode_context + steps,
            window=self.window,
            decode_window_tokens=self.decode_window_tokens + steps * below,
            num_decodes_below_window=below,
            min_window_gap=self.min_window_gap - steps if below else 0,
        )
