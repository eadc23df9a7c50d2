"""Population with idea diversity.

Passing candidates are grouped by their structure signature
(:func:`kernels.mutate.structure`: family, storage, loop order,
algorithmic edits; not the numeric tile parameters).  Parents are drawn
from the best few members of each of the best few *groups*, so a new idea
that is not yet the global best still gets offspring instead of being
crowded out by tuning of the current leader.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Member:
    """A passing candidate: its genome, median time and iteration."""

    genome: dict
    time_s: float
    iteration: int
    group: str


@dataclass
class Population:
    """Passing candidates by group, each group sorted fastest first."""

    groups_kept: int = 4      # parents come from the best this many groups ...
    per_group: int = 3        # ... and from the best this many members of each
    explore: float = 0.2      # chance to draw from any group (keeps weak ideas alive)
    groups: dict[str, list[Member]] = field(default_factory=dict)

    def add(self, m: Member) -> None:
        """Insert a passing candidate."""
        g = self.groups.setdefault(m.group, [])
        g.append(m)
        g.sort(key=lambda x: x.time_s)

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups.values())

    def best(self) -> Member | None:
        """The fastest member overall."""
        tops = [g[0] for g in self.groups.values() if g]
        return min(tops, key=lambda x: x.time_s) if tops else None

    def ranked_groups(self) -> list[tuple[str, list[Member]]]:
        """Groups ordered by their best member's time."""
        return sorted(((k, v) for k, v in self.groups.items() if v), key=lambda kv: kv[1][0].time_s)

    def select(self, rng: random.Random) -> Member | None:
        """A parent: uniform over the top groups (or any group, sometimes), then
        rank-weighted within the group's best few."""
        ranked = self.ranked_groups()
        if not ranked:
            return None
        pool = ranked if rng.random() < self.explore else ranked[:self.groups_kept]
        _, members = rng.choice(pool)
        top = members[:self.per_group]
        weights = [1.0 / (i + 1) for i in range(len(top))]
        return rng.choices(top, weights=weights)[0]

    def finalists(self, n_groups: int) -> list[Member]:
        """The best member of each of the ``n_groups`` best groups."""
        return [members[0] for _, members in self.ranked_groups()[:n_groups]]
