"""Bounded text for error replies and log lines: lists summarized, then cut, saying how much
(docs/operations/limits.md). Pure.
"""

from __future__ import annotations

MAX_MESSAGE = 2048  # characters in an error reply (a CRI client shows it to the user)
MAX_ITEM = 200  # characters kept of one list item
LIST_HEAD = 5  # list items kept before "... and N more"


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    marker = f" ...[{len(text) - limit} more characters]... "
    keep = max(0, limit - len(marker))
    tail = keep // 4  # the end often says where (a file, a field): keep some of it
    return text[: keep - tail] + marker + text[len(text) - tail :]


def summarize(items: list[str], head: int = LIST_HEAD, item_limit: int = MAX_ITEM) -> list[str]:
    """The first ``head`` items (each clipped) plus "... and N more" when there are more."""
    kept = [clip(item, item_limit) for item in items[:head]]
    if len(items) > head:
        kept.append(f"... and {len(items) - head} more")
    return kept


def bound_message(text: str, limit: int = MAX_MESSAGE) -> str:
    """An error message of at most ``limit`` characters: ``; ``- and ``, ``-separated
    lists summarized first, then the whole cut."""
    if len(text) <= limit:
        return text
    parts = []
    for part in summarize(text.split("; "), item_limit=limit):
        names = part.split(", ")
        parts.append(", ".join(summarize(names)) if len(names) > LIST_HEAD else part)
    return clip("; ".join(parts), limit)
