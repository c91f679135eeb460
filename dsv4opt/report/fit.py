"""Text that fits a column: names shortened so different names stay different."""

from __future__ import annotations

from collections import defaultdict

ELLIPSIS = "…"


def distinct_labels(texts: list[str], width: int, keys: list[str] | None = None,
                    fuller: list[str] | None = None) -> list[str]:
    """Each text in at most `width` characters; entries whose keys differ get labels that differ.

    texts are what to show (short kernel names), keys what makes two entries different (the full
    names; the texts themselves when not given), fuller a longer text to start from where two
    different keys share a text (short names that collapsed the template arguments they differ in).
    A text that fits is kept. A longer one is cut with an ellipsis; where that would make different
    entries look alike, each keeps its head and, after the ellipsis, the stretch where it parts from
    the ones it would be taken for (five CUTLASS GEMMs differ in their tile sizes, not their first
    14 characters), up to its tail; as a last resort a number.
    """
    width = max(width, 4)
    keys = list(texts) if keys is None else keys
    texts = list(texts)
    if fuller is not None:
        for group in _clashes(keys, texts):
            for i in group:
                texts[i] = fuller[i]
    labels = [t if len(t) <= width else t[: width - 1] + ELLIPSIS for t in texts]
    # Each round, the entries that still look alike show the stretch from where they part (the end
    # of what their texts share); sub-groups that still clash share more, so their windows move on.
    seen: set[tuple[int, int]] = set()
    while clashes := _clashes(keys, labels):
        moved = False
        for group in clashes:
            parted = len(_shared_prefix([texts[i] for i in group]))
            for i in group:
                moved |= (i, parted) not in seen
                seen.add((i, parted))
                labels[i] = _window(texts[i], parted, width)
        if not moved:
            break
    clashing = sorted({i for g in _clashes(keys, labels) for i in g})
    numbers = {k: n for n, k in enumerate(dict.fromkeys(keys[i] for i in clashing), 1)}
    for i in clashing:
        tag = f"{ELLIPSIS}#{numbers[keys[i]]}"
        labels[i] = texts[i][: width - len(tag)] + tag
    return labels


def _clashes(keys: list[str], labels: list[str]) -> list[list[int]]:
    """Groups of positions whose labels are equal while their keys are not."""
    by_label: dict[str, list[int]] = defaultdict(list)
    for i, label in enumerate(labels):
        by_label[label].append(i)
    return [g for g in by_label.values() if len({keys[i] for i in g}) > 1]


def _window(text: str, parted: int, width: int) -> str:
    """The head of text, an ellipsis, and the stretch starting just before position `parted`."""
    if len(text) <= width:
        return text
    head = max(4, width // 3)
    if parted < head:
        return text[: width - 1] + ELLIPSIS
    room = width - head - 1
    start = max(head, parted - 4)
    if start + room >= len(text):
        return text[:head] + ELLIPSIS + text[len(text) - room:]
    return text[:head] + ELLIPSIS + text[start: start + room - 1] + ELLIPSIS


def _shared_prefix(texts: list[str]) -> str:
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]
