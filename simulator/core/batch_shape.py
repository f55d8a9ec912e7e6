"""`BatchShape`: the aggregate shape of one engine step, all a cost model needs.

The scheduler fills it while it schedules (a few additions per request), so
neither the cost model nor the simulator has to walk the batch again.
A request is a *decode* when it computes exactly one new token on top of a
non-empty context; everything else (prompt chunks, recomputes) is *prefill*.
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
        if total > self.max_context:
            self.max_context = total

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
    def from_lists(cls, num_new_tokens: list[int], num_context_before: list[int]) -> BatchShape:
        shape = cls()
        for q, c in zip(num_new_tokens, num_context_before, strict=True):
            shape.add(q, c)
        return shape

    def advanced(self, steps: int) -> BatchShape:
        """The shape of this all-decode batch `steps` steps later (each context grew by `steps`)."""
        if self.num_prefill_reqs:
            raise ValueError("advanced() is only defined for all-decode batches")
        return BatchShape(
            num_reqs=self.num_reqs,
            num_tokens=self.num_tokens,
            num_decode_reqs=self.num_decode_reqs,
            decode_context_tokens=self.decode_context_tokens + steps * self.num_decode_reqs,
            max_context=self.max_context + steps,
            max_decode_context=self.max_decode_context + steps,
        )
