"""Plain-text tables for the benchmarks' reports: one header row, a rule under it, aligned columns."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def render(lines: Sequence[Sequence[str]], left: Collection[int] = (0,)) -> str:
    """`lines[0]` is the header; columns in `left` are left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = [" | ".join(c.ljust(w) if i in left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(line, widths, strict=True))).rstrip() for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)
