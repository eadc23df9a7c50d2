"""Where candidate evaluations run: dask.distributed, or in this process.

Both backends take gate tasks (dicts) and hand back ``(token, result)``
pairs as evaluations finish.  The dask backend runs
:func:`kernels.search.evaluate.evaluate_isolated` on the workers (each
evaluation in its own child process of a worker); a worker that dies
mid-task has its task rescheduled by the scheduler, and a task that keeps
killing workers comes back as a ``crash`` result.  Nothing here raises for a
failed evaluation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from .evaluate import _fail, evaluate_isolated, run_gate


class InProcess:
    """Evaluate synchronously in this process (``--no-dask``; debugging)."""

    name = "in-process"

    def __init__(self) -> None:
        self._done: list[tuple[Any, dict]] = []

    def submit(self, token: Any, task: dict) -> None:
        """Evaluate now; the result is returned by the next ``as_completed``."""
        self._done.append((token, run_gate(task)))

    def pending(self) -> int:
        """Evaluations submitted but not yet returned."""
        return len(self._done)

    def as_completed(self) -> Iterator[tuple[Any, dict]]:
        """Yield finished evaluations (all of them: this backend is synchronous)."""
        while self._done:
            yield self._done.pop(0)

    def close(self) -> None:
        """Nothing to release."""


class Dask:
    """Evaluate on a dask.distributed cluster (local by default)."""

    def __init__(self, scheduler: str | None = None, n_workers: int = 2,
                 allowed_failures: int = 2) -> None:
        import dask
        from distributed import Client, LocalCluster

        # A task whose worker dies is rescheduled; after this many worker deaths
        # it is given up (KilledWorker) and recorded as a crash.
        dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures})
        self.cluster = None
        if scheduler:
            self.client = Client(scheduler)
            self.name = f"dask {scheduler}"
        else:
            # Localhost only, no dashboard: the search needs no network beyond
            # the scheduler <-> worker links on this machine.
            self.cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1,
                                        processes=True, dashboard_address=None,
                                        host="127.0.0.1", silence_logs=logging.ERROR)
            self.client = Client(self.cluster)
            self.name = f"dask LocalCluster({n_workers} worker processes)"
        from distributed import as_completed

        self._ac = as_completed([], with_results=False)
        self._tokens: dict[str, Any] = {}

    def n_workers(self) -> int:
        """Workers currently connected."""
        return len(self.client.scheduler_info().get("workers", {}))

    def submit(self, token: Any, task: dict) -> None:
        """Queue an evaluation on the cluster."""
        fut = self.client.submit(evaluate_isolated, task, pure=False)
        self._tokens[fut.key] = token
        self._ac.add(fut)

    def pending(self) -> int:
        """Evaluations submitted but not yet returned."""
        return len(self._tokens)

    def as_completed(self) -> Iterator[tuple[Any, dict]]:
        """Yield evaluations as they finish (blocks until at least one does)."""
        if not self._tokens:
            return
        fut = next(self._ac)
        yield from self._collect(fut)
        # Drain whatever else is already finished without blocking again.
        for more in self._ac.next_batch(block=False):
            yield from self._collect(more)

    def _collect(self, fut: Any) -> Iterator[tuple[Any, dict]]:
        token = self._tokens.pop(fut.key)
        try:
            res = fut.result()
        except Exception as e:  # KilledWorker, lost scheduler, ...: a result, not a crash
            res = _fail("crash", f"evaluation lost: {type(e).__name__}: {str(e)[:300]}",
                        {"exception": type(e).__name__})
        fut.release()
        yield token, res

    def close(self) -> None:
        """Shut the client (and the local cluster, if we started it) down."""
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()
