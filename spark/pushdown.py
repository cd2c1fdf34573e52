"""Filter pushdown of the equeue source: Spark's pushed filters -> what to read.

Spark hands the reader the conjuncts of a query's WHERE clause (pyspark.sql.datasource.Filter
objects, ANDed). Those on topic, queue_id, queue_offset, tag and store_ts become a `Pushdown`:

- topic, queue_id, queue_offset: partition pruning (which queues, which offset range) on the
  driver, so pruned queues and offsets are never read at all;
- store_ts: an offset range per queue through the store's `offset_for_timestamp` (store times
  never go backwards within a store), plus an exact row test in the reader;
- tag: a vectorised row test on each batch before the other columns are built.

Everything else (other columns, OR-ed conditions Spark cannot split, `queue_offset IN (...)`
beyond its min/max) is returned to Spark, which evaluates it after the scan: a pushed filter
only ever narrows what is read to rows the filter could keep, so results are the same with or
without pushdown. Null semantics are Spark's: `tag = 'x'`, `tag <> 'x'` and `tag IN (...)` never
keep an untagged row.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from equeue_core.export import RowFilter

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICRO = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class Pushdown:
    """What the pushed filters allow (all conditions ANDed); picklable.

    `nothing` is True when some filter can never hold (another topic, an empty range): no
    partition is planned."""

    nothing: bool = False
    queues: frozenset[int] | None = None          # only these queue ids
    queues_not: frozenset[int] = frozenset()      # never these
    queue_min: int | None = None                  # inclusive
    queue_max: int | None = None                  # inclusive
    offset_min: int | None = None                 # inclusive
    offset_max: int | None = None                 # inclusive
    rows: RowFilter = field(default_factory=RowFilter)

    def keeps_queue(self, q: int) -> bool:
        return ((self.queues is None or q in self.queues) and q not in self.queues_not
                and (self.queue_min is None or q >= self.queue_min)
                and (self.queue_max is None or q <= self.queue_max))

    def offset_bounds(self, start: int, end: int) -> tuple[int, int]:
        """[start, end) narrowed to the pushed offset range (possibly empty: end <= start)."""
        if self.offset_min is not None:
            start = max(start, self.offset_min)
        if self.offset_max is not None:
            end = min(end, self.offset_max + 1)
        return start, max(start, end)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _micros(v: Any) -> int | None:
    """A Spark TIMESTAMP literal (an aware datetime) as microseconds since the epoch."""
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return (v - _EPOCH) // _MICRO
    return None


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _tightest(current: int | None, new: int, lower: bool) -> int:
    if current is None:
        return new
    return max(current, new) if lower else min(current, new)


class _Builder:
    """Accumulates one filter at a time; `take(f)` says whether the filter is fully handled."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.p = Pushdown()
        self.rows = RowFilter()

    # -------------------------------------------------------------- per column
    def _topic(self, f: Any, negated: bool) -> bool:
        from pyspark.sql.datasource import EqualNullSafe, EqualTo, In, IsNotNull, IsNull

        if isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(f.value, str):
            if (f.value == self.topic) == negated:
                self.p = replace(self.p, nothing=True)
            return True
        if isinstance(f, In) and not negated and all(isinstance(v, str) or v is None for v in f.value):
            if self.topic not in f.value:
                self.p = replace(self.p, nothing=True)
            return True
        if isinstance(f, (IsNull, IsNotNull)):
            if isinstance(f, IsNull) != negated:  # topic is never null
                self.p = replace(self.p, nothing=True)
            return True
        return False

    def _range(self, f: Any, value: int, lo_key: str, hi_key: str) -> bool:
        from pyspark.sql.datasource import (
            EqualNullSafe,
            EqualTo,
            GreaterThan,
            GreaterThanOrEqual,
            LessThan,
            LessThanOrEqual,
        )

        p = self.p
        lo, hi = getattr(p, lo_key), getattr(p, hi_key)
        if isinstance(f, (EqualTo, EqualNullSafe)):
            lo, hi = _tightest(lo, value, True), _tightest(hi, value, False)
        elif isinstance(f, GreaterThan):
            lo = _tightest(lo, value + 1, True)
        elif isinstance(f, GreaterThanOrEqual):
            lo = _tightest(lo, value, True)
        elif isinstance(f, LessThan):
            hi = _tightest(hi, value - 1, False)
        elif isinstance(f, LessThanOrEqual):
            hi = _tightest(hi, value, False)
        else:
            return False
        self.p = replace(p, **{lo_key: lo, hi_key: hi})
        return True

    def _queue_id(self, f: Any, negated: bool) -> bool:
        from pyspark.sql.datasource import EqualTo, In, IsNotNull, IsNull

        if isinstance(f, (IsNull, IsNotNull)):
            if isinstance(f, IsNull) != negated:
                self.p = replace(self.p, nothing=True)
            return True
        if isinstance(f, In):
            ids = [_int(v) for v in f.value if v is not None]
            if any(v is None for v in ids):
                return False
            if negated:
                if any(v is None for v in f.value):
                    return False  # NOT IN (.., NULL) is never true: leave it to Spark
                self.p = replace(self.p, queues_not=self.p.queues_not | frozenset(ids))  # type: ignore[arg-type]
            else:
                keep = frozenset(ids)  # type: ignore[arg-type]
                self.p = replace(self.p, queues=keep if self.p.queues is None else self.p.queues & keep)
            return True
        value = _int(getattr(f, "value", None))
        if value is None:
            return False
        if negated:
            if isinstance(f, EqualTo):
                self.p = replace(self.p, queues_not=self.p.queues_not | {value})
                return True
            return False
        return self._range(f, value, "queue_min", "queue_max")

    def _queue_offset(self, f: Any, negated: bool) -> bool:
        from pyspark.sql.datasource import In, IsNotNull, IsNull

        if isinstance(f, (IsNull, IsNotNull)):
            if isinstance(f, IsNull) != negated:
                self.p = replace(self.p, nothing=True)
            return True
        if negated:
            return False
        if isinstance(f, In):
            offsets = [_int(v) for v in f.value if v is not None]
            if offsets and all(v is not None for v in offsets):
                # read [min, max] only; Spark still picks the listed offsets out of it
                self._range_both(min(offsets), max(offsets))  # type: ignore[type-var]
            return False
        value = _int(getattr(f, "value", None))
        if value is None:
            return False
        return self._range(f, value, "offset_min", "offset_max")

    def _range_both(self, lo: int, hi: int) -> None:
        self.p = replace(self.p, offset_min=_tightest(self.p.offset_min, lo, True),
                         offset_max=_tightest(self.p.offset_max, hi, False))

    def _tag(self, f: Any, negated: bool) -> bool:
        from pyspark.sql.datasource import EqualNullSafe, EqualTo, In, IsNotNull, IsNull

        r = self.rows
        if isinstance(f, (IsNull, IsNotNull)) or (isinstance(f, EqualNullSafe) and f.value is None):
            is_null = isinstance(f, (IsNull, EqualNullSafe)) != negated
            if r.tag_is_null is not None and r.tag_is_null != is_null:
                self.p = replace(self.p, nothing=True)
            self.rows = replace(r, tag_is_null=is_null)
            return True
        if isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(f.value, str):
            values = [f.value]
            null_safe_not = negated and isinstance(f, EqualNullSafe)
        elif isinstance(f, In) and all(isinstance(v, str) or v is None for v in f.value):
            if negated and any(v is None for v in f.value):
                return False  # NOT IN (.., NULL) is never true: leave it to Spark
            values = [v for v in f.value if v is not None]
            null_safe_not = False
        else:
            return False
        if null_safe_not:
            return False  # NOT (tag <=> 'x') keeps untagged rows: leave it to Spark
        if negated:
            self.rows = replace(r, tag_not_in=(r.tag_not_in or frozenset()) | frozenset(values))
        else:
            keep = frozenset(values)
            self.rows = replace(r, tag_in=keep if r.tag_in is None else r.tag_in & keep)
        return True

    def _store_ts(self, f: Any, negated: bool) -> bool:
        from pyspark.sql.datasource import (
            EqualNullSafe,
            EqualTo,
            GreaterThan,
            GreaterThanOrEqual,
            IsNotNull,
            IsNull,
            LessThan,
            LessThanOrEqual,
        )

        if isinstance(f, (IsNull, IsNotNull)):
            if isinstance(f, IsNull) != negated:
                self.p = replace(self.p, nothing=True)
            return True
        us = _micros(getattr(f, "value", None))
        if negated or us is None:
            return False
        r = self.rows
        lo, hi = r.store_ts_min, r.store_ts_max
        if isinstance(f, (EqualTo, EqualNullSafe)):
            if us % 1000:  # store times are whole milliseconds
                self.p = replace(self.p, nothing=True)
                return True
            lo, hi = _tightest(lo, us // 1000, True), _tightest(hi, us // 1000, False)
        elif isinstance(f, GreaterThan):
            lo = _tightest(lo, us // 1000 + 1, True)
        elif isinstance(f, GreaterThanOrEqual):
            lo = _tightest(lo, _ceil_div(us, 1000), True)
        elif isinstance(f, LessThan):
            hi = _tightest(hi, _ceil_div(us, 1000) - 1, False)
        elif isinstance(f, LessThanOrEqual):
            hi = _tightest(hi, us // 1000, False)
        else:
            return False
        self.rows = replace(r, store_ts_min=lo, store_ts_max=hi)
        return True

    # -------------------------------------------------------------- dispatch
    def take(self, f: Any) -> bool:
        from pyspark.sql.datasource import Not

        negated = isinstance(f, Not)
        inner = f.child if negated else f
        attribute = getattr(inner, "attribute", None)
        if not attribute or len(attribute) != 1:
            return False
        handler = {"topic": self._topic, "queue_id": self._queue_id, "queue_offset": self._queue_offset,
                   "tag": self._tag, "store_ts": self._store_ts}.get(str(attribute[0]).lower())
        return handler is not None and handler(inner, negated)

    def result(self) -> Pushdown:
        p = replace(self.p, rows=self.rows)
        r = self.rows
        empty = ((p.queue_min is not None and p.queue_max is not None and p.queue_min > p.queue_max)
                 or (p.offset_min is not None and p.offset_max is not None and p.offset_min > p.offset_max)
                 or (r.store_ts_min is not None and r.store_ts_max is not None and r.store_ts_min > r.store_ts_max)
                 or (p.queues is not None and not p.queues)
                 or (r.tag_in is not None and not r.tag_in)
                 or (r.tag_is_null is True and (r.tag_in is not None or r.tag_not_in is not None)))
        return replace(p, nothing=True) if empty else p


def push_filters(filters: Sequence[Any], topic: str) -> tuple[Pushdown, list[Any]]:
    """(what the supported filters allow, the filters Spark must still evaluate).

    Every returned filter is one of `filters` (by reference), as pyspark requires."""
    b = _Builder(topic)
    rest = [f for f in filters if not b.take(f)]
    return b.result(), rest

