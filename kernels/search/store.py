"""Result store for the kernel search: one sqlite3 file, WAL mode.

Every candidate evaluation becomes one row of ``results``, committed the
moment its result arrives, so a crash of the loop, a worker or the machine
loses at most the evaluations still in flight.  Only the search driver
writes (workers return results to it); readers (``report``) may open the
file at any time, which is what WAL is for.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    started    REAL NOT NULL,
    finished   REAL,
    config     TEXT NOT NULL            -- JSON: shape, batch, budget, seed, ...
);
CREATE TABLE IF NOT EXISTS results (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs(run_id),
    iteration   INTEGER NOT NULL,       -- submission order within the run
    grp         TEXT NOT NULL,          -- structure signature (idea group)
    genome_key  TEXT NOT NULL,          -- hash of the genome (dedup)
    parent      INTEGER,                -- iteration of the parent, NULL for seeds
    family      TEXT NOT NULL,
    params      TEXT NOT NULL,          -- JSON genome (family, params, edits)
    source      TEXT NOT NULL,
    entry       TEXT NOT NULL,
    status      TEXT NOT NULL,          -- ok | verify_error | compile_error | fault |
                                        -- timeout | check_failed | crash
    reason      TEXT,                   -- one line: why it failed
    detail      TEXT,                   -- JSON: fault attributes, per-input verdicts, ...
    time_s      REAL,                   -- median launch time (ok rows only)
    times       TEXT,                   -- JSON list of launch times
    ratios      TEXT,                   -- JSON: worst checker ratios over all inputs
    worker      TEXT,                   -- where it ran
    eval_s      REAL,                   -- wall time of the whole evaluation
    created     REAL NOT NULL,
    ood_status  TEXT,                   -- finalists only: ok | <failure status>
    ood_reason  TEXT,
    ood_detail  TEXT
);
CREATE INDEX IF NOT EXISTS results_run ON results(run_id, iteration);
"""


@dataclass
class Row:
    """One stored evaluation (a row of ``results``, JSON columns decoded)."""

    id: int
    run_id: int
    iteration: int
    grp: str
    genome_key: str
    parent: int | None
    family: str
    params: dict
    source: str
    entry: str
    status: str
    reason: str | None
    detail: Any
    time_s: float | None
    times: list | None
    ratios: dict | None
    worker: str | None
    eval_s: float | None
    created: float
    ood_status: str | None
    ood_reason: str | None
    ood_detail: Any


_JSON_COLS = ("params", "detail", "times", "ratios", "ood_detail")


class Store:
    """A search database; safe to open from several processes (WAL)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: autocommit; each write below is its own transaction,
        # so a result is durable as soon as put_result returns.
        self.db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        """Close the connection."""
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------
    def new_run(self, config: dict) -> int:
        """Register a search run; returns its id."""
        cur = self.db.execute("INSERT INTO runs(started, config) VALUES (?, ?)",
                              (time.time(), json.dumps(config)))
        return int(cur.lastrowid)

    def finish_run(self, run_id: int) -> None:
        """Mark a run finished (a run without this ended abnormally)."""
        self.db.execute("UPDATE runs SET finished=? WHERE run_id=?", (time.time(), run_id))

    def runs(self) -> list[dict]:
        """All runs, oldest first."""
        out = []
        for r in self.db.execute("SELECT * FROM runs ORDER BY run_id"):
            d = dict(r)
            d["config"] = json.loads(d["config"])
            out.append(d)
        return out

    def last_run(self) -> int | None:
        """Id of the newest run, or None."""
        r = self.db.execute("SELECT MAX(run_id) FROM runs").fetchone()
        return None if r[0] is None else int(r[0])

    # -- results ------------------------------------------------------------
    def put_result(self, run_id: int, iteration: int, cand: dict, res: dict) -> int:
        """Store one evaluation (committed on return); returns the row id.

        ``cand`` is the candidate (genome, source, entry, group, key, parent);
        ``res`` the evaluation result dict from :mod:`kernels.search.evaluate`.
        """
        cur = self.db.execute(
            "INSERT INTO results(run_id, iteration, grp, genome_key, parent, family, params,"
            " source, entry, status, reason, detail, time_s, times, ratios, worker, eval_s,"
            " created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, iteration, cand["group"], cand["key"], cand.get("parent"),
             cand["genome"]["family"], json.dumps(cand["genome"]), cand["source"],
             cand["entry"], res["status"], res.get("reason"), json.dumps(res.get("detail")),
             res.get("time_s"), json.dumps(res.get("times")), json.dumps(res.get("ratios")),
             res.get("worker"), res.get("eval_s"), time.time()))
        return int(cur.lastrowid)

    def put_ood(self, row_id: int, res: dict) -> None:
        """Attach a held-out (out-of-distribution) re-check to a stored result."""
        self.db.execute("UPDATE results SET ood_status=?, ood_reason=?, ood_detail=? WHERE id=?",
                        (res["status"], res.get("reason"), json.dumps(res.get("detail")),
                         row_id))

    def results(self, run_id: int | None = None, status: str | None = None) -> list[Row]:
        """Stored results (of one run, optionally one status), in iteration order."""
        q, args = "SELECT * FROM results WHERE 1=1", []
        if run_id is not None:
            q += " AND run_id=?"
            args.append(run_id)
        if status is not None:
            q += " AND status=?"
            args.append(status)
        q += " ORDER BY run_id, iteration"
        return list(self._rows(q, args))

    def count(self, run_id: int | None = None) -> int:
        """Number of stored results (of one run)."""
        if run_id is None:
            return int(self.db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
        return int(self.db.execute("SELECT COUNT(*) FROM results WHERE run_id=?",
                                   (run_id,)).fetchone()[0])

    def _rows(self, q: str, args: list) -> Iterator[Row]:
        for r in self.db.execute(q, args):
            d = dict(r)
            for c in _JSON_COLS:
                d[c] = json.loads(d[c]) if d[c] is not None else None
            yield Row(**d)
