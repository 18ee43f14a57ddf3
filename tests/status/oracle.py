"""What the status page must show, counted straight from the tables (full
scans, no index, none of the page's code), to compare the page against."""

from __future__ import annotations

from collections import defaultdict
from html.parser import HTMLParser
from typing import Any

import sqlalchemy as sa

from app.platform.database import Database

METRICS = ("queued", "running", "succeeded", "failed", "cancelled", "expired")
CARDS = ("queued", "running", "succeeded", "failed")  # the totals the page shows
OTHER = "(other)"  # the page's line for models not open to every tenant


def expected_lines(database: Database, public: set[str] | None) -> dict[str, dict[str, int]]:
    """Per model line (non-public models folded into OTHER unless `public` is None,
    the operator's view), and "total"."""
    query = sa.text(
        """
        SELECT model,
               count(*) FILTER (WHERE status = 'queued') AS queued,
               count(*) FILTER (WHERE status = 'running') AS running,
               count(*) FILTER (WHERE status = 'succeeded' AND r) AS succeeded,
               count(*) FILTER (WHERE status = 'failed' AND r) AS failed,
               count(*) FILTER (WHERE status = 'cancelled' AND r) AS cancelled,
               count(*) FILTER (WHERE status = 'expired' AND r) AS expired
        FROM (SELECT *, (purged_at IS NULL
                         AND finished_at > now() - interval '1 hour') AS r FROM jobs) j
        GROUP BY model
        """
    )
    lines: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(METRICS, 0))
    with database.engine.connect() as conn:
        for row in conn.execute(query):
            counts: dict[str, Any] = row._asdict()
            if not any(counts[m] for m in METRICS):
                continue  # the page lists models with something to show
            name = row.model if public is None or row.model in public else OTHER
            for metric in METRICS:
                lines[name][metric] += counts[metric]
                lines["total"][metric] += counts[metric]
    return dict(lines)


def open_dead_letters(database: Database) -> int:
    with database.engine.connect() as conn:
        count: int = conn.execute(
            sa.text("SELECT count(*) FROM dead_letters WHERE replayed_at IS NULL")
        ).scalar_one()
    return count


class _Cells(HTMLParser):
    """Text of every element with a `data-metric` attribute, keyed by
    (data-model or data-queue or "", data-metric)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], str] = {}
        self._open: list[tuple[tuple[str, str], list[str]] | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if "data-metric" in a:
            key = (a.get("data-model") or a.get("data-queue") or "", a["data-metric"] or "")
            self._open.append((key, []))
        else:
            self._open.append(None)

    def handle_endtag(self, tag: str) -> None:
        entry = self._open.pop() if self._open else None
        if entry is not None:
            self.cells[entry[0]] = " ".join("".join(entry[1]).split())

    def handle_data(self, data: str) -> None:
        for entry in self._open:
            if entry is not None:
                entry[1].append(data)


def shown(html: str) -> dict[tuple[str, str], str]:
    parser = _Cells()
    parser.feed(html)
    return parser.cells


def table_of(cells: dict[tuple[str, str], str]) -> dict[str, dict[str, int]]:
    """The page's model table as the oracle shapes it (totals from the cards)."""
    lines: dict[str, dict[str, int]] = {}
    for (model, metric), text in cells.items():
        if metric in METRICS and model:
            lines.setdefault(model, {})[metric] = int(text)
    return {**lines, "total": {m: int(cells[("", f"total-{m}")]) for m in CARDS}}


def as_page(expected: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The oracle's lines as the page shows them: totals only for its cards."""
    total = expected.get("total", dict.fromkeys(METRICS, 0))
    return {**expected, "total": {m: total[m] for m in CARDS}}
