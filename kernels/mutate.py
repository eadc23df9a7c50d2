"""Mutations of kernel sources: the bugs an autogenerator makes, and the search's genomes.

One engine for the safety fuzz (tests/test_qr_fuzz.py) and the kernel search
(``kernels.search``).

Text mutators yield :class:`Mutant` objects, one per site they can change:
off-by-one loop bounds (``<`` -> ``<=``), loops that stop one short
(``< e`` -> ``< (e) - 1``), swapped strides (``i * ld + j`` -> ``j * ld + i``),
a wrong leading dimension (``* n +`` -> ``* m +`` and friends), dropping the
clamp of the last panel (the panel width no longer divides n:
``k - j < nb ? k - j : nb`` -> ``nb``), skewed batch offsets and an origin
moved by one element (``cap_offset_f32(c, e)`` -> ``cap_offset_f32(c, e + 1)``).
The safety fuzz runs them under the checked runtime (each must pass the
checker, be flagged by it, or fault, with canaries intact).

A *genome* is what the search evolves, a small JSON-able dict::

    {"family": "geqrf" | "geqr2",
     "params": {"storage": "f32"|"f16", "nb": int, "cw": int, "unroll": int, "order": str},
     "edits":  [{"op": name, "site": int}, ...]}

It is rendered by taking the seed source of the family (``kernels.sources``),
filling *holes* in it and applying source *edits*:

* parameters (runtime scalar or text holes): ``nb`` panel width (a kernel
  argument), ``cw`` the column tile of the block-reflector update (the
  ``64`` constants of ``larfb``), ``unroll`` (manual unroll of larfb's
  fixed-trip inner loops), ``order`` (``row``: the seed's row-streaming
  ``larf_left``; ``col``: a template with the column loop outside),
  ``storage`` (``f16``: the half-storage kernel family ``geqrf_f16``);
* structural edits from templates: ``nrm2_onepass`` (an unscaled one-pass
  column norm: fewer passes, but it over/underflows on huge/tiny data) and
  ``no_rescale`` (drop LAPACK's tiny-column rescaling in ``larfg``): both
  are the kind of specialisation a search finds "faster" on ordinary
  inputs, which is what the held-out re-check is for;
* bug edits: the text mutators above, by kind (``op``); ``site`` picks which
  of the mutator's sites.  Most of these fault (the checked runtime refuses
  the access) or fail the checker.

Holes are found by pattern in the seed text; a hole that the current seed
does not have makes that mutation unavailable (never a crash).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import sources

# ---------------------------------------------------------------------------
# text mutators

@dataclass(frozen=True)
class Mutant:
    """One mutated source: which mutator, where (1-based line), and the text."""

    kind: str
    line: int
    description: str
    source: str


def _line_of(src: str, pos: int) -> int:
    return src.count("\n", 0, pos) + 1


def _sub_at(src: str, m: re.Match, new: str) -> str:
    return src[:m.start()] + new + src[m.end():]


_FOR_LT = re.compile(r"(for \([^;]*;\s*\w+\s*)<(\s*[^;=][^;]*;)")


def off_by_one(src: str) -> Iterator[Mutant]:
    """``for (...; i < bound; ...)`` -> ``i <= bound`` (one mutant per loop)."""
    for m in _FOR_LT.finditer(src):
        new = m.group(1) + "<=" + m.group(2)
        yield Mutant("off_by_one", _line_of(src, m.start()),
                     f"loop bound '<' -> '<=': {m.group(0).strip()[:60]}", _sub_at(src, m, new))


_STRIDE = re.compile(r"\((\w+(?: \+ \w+)?)\) \* (\w+) \+ (\w+) \+ (\w+)"
                     r"|\b(\w+) \* (\w+) \+ (\w+)\b")


def swapped_strides(src: str) -> Iterator[Mutant]:
    """``i * ld + j`` -> ``j * ld + i`` and ``(a + t) * ld + c + p`` -> ``(a + p) * ld + c + t``."""
    for m in _STRIDE.finditer(src):
        if m.group(1) is not None:
            row, ld, c, p = m.group(1), m.group(2), m.group(3), m.group(4)
            parts = row.split(" + ")
            if len(parts) != 2:
                continue
            new = f"({parts[0]} + {p}) * {ld} + {c} + {parts[1]}"
        else:
            i, ld, j = m.group(5), m.group(6), m.group(7)
            if i.isdigit() or j.isdigit() or i == j:
                continue
            new = f"{j} * {ld} + {i}"
        if new == m.group(0):
            continue
        yield Mutant("swapped_strides", _line_of(src, m.start()),
                     f"swapped strides: {m.group(0)} -> {new}", _sub_at(src, m, new))


_LD_NAMES = ("n", "m", "nb", "ld", "ldt", "ldv", "ldc")
_LD = re.compile(r"\* (" + "|".join(_LD_NAMES) + r") \+")


def wrong_leading_dimension(src: str) -> Iterator[Mutant]:
    """``* n +`` -> ``* m +`` (and n<->m, nb->n, ld->ld+1 ...): a wrong leading dimension."""
    swap = {"n": "m", "m": "n", "nb": "n", "ld": "(ld + 1)", "ldt": "(ldt + 1)",
            "ldv": "(ldv + 1)", "ldc": "(ldc + 1)"}
    for m in _LD.finditer(src):
        new = f"* {swap[m.group(1)]} +"
        yield Mutant("wrong_leading_dimension", _line_of(src, m.start()),
                     f"leading dimension {m.group(1)} -> {swap[m.group(1)]}", _sub_at(src, m, new))


_CLAMP = re.compile(r"(\w+) - (\w+) < (\w+) \? \1 - \2 : \3")


def panel_not_dividing(src: str) -> Iterator[Mutant]:
    """Drop the last-panel clamp ``jb = min(nb, k - j)`` -> ``jb = nb``."""
    for m in _CLAMP.finditer(src):
        yield Mutant("panel_not_dividing", _line_of(src, m.start()),
                     f"last panel not clamped: {m.group(0)} -> {m.group(3)}",
                     _sub_at(src, m, m.group(3)))


_BATCH = re.compile(r"\bb \* m \* n\b|\bb \* k\b")


def batch_offset(src: str) -> Iterator[Mutant]:
    """Skew a per-matrix offset by one matrix row (``b * m * n`` -> ``(b + 1) * m * n - 1``)."""
    for m in _BATCH.finditer(src):
        new = "((b + 1) * m * n - 1)" if "m * n" in m.group(0) else "(b * k + 1)"
        yield Mutant("batch_offset", _line_of(src, m.start()),
                     f"batch offset {m.group(0)} -> {new}", _sub_at(src, m, new))


_FOR_LT_END = re.compile(r"(for \([^;]*;\s*\w+\s*)<(\s*)([^;=][^;]*);")


def loop_short(src: str) -> Iterator[Mutant]:
    """``for (...; i < e; ...)`` -> ``i < (e) - 1``: the loop stops one iteration early."""
    for m in _FOR_LT_END.finditer(src):
        new = f"{m.group(1)}<{m.group(2)}({m.group(3).strip()}) - 1;"
        yield Mutant("loop_short", _line_of(src, m.start()),
                     f"loop stops one short: {m.group(0).strip()[:60]}", _sub_at(src, m, new))


_OFFSET = re.compile(r"cap_offset_f(16|32)\((\w+), ([^;]+?)\);")


def offset_plus_one(src: str) -> Iterator[Mutant]:
    """``cap_offset_f32(c, e)`` -> ``cap_offset_f32(c, e + 1)``: an origin one element off."""
    for m in _OFFSET.finditer(src):
        new = f"cap_offset_f{m.group(1)}({m.group(2)}, {m.group(3)} + 1);"
        yield Mutant("offset_plus_one", _line_of(src, m.start()),
                     f"origin moved by one: {m.group(0)[:60]}", _sub_at(src, m, new))


MUTATORS: dict[str, Callable[[str], Iterator[Mutant]]] = {
    "off_by_one": off_by_one,
    "loop_short": loop_short,
    "swapped_strides": swapped_strides,
    "wrong_leading_dimension": wrong_leading_dimension,
    "panel_not_dividing": panel_not_dividing,
    "batch_offset": batch_offset,
    "offset_plus_one": offset_plus_one,
}


def mutants(src: str, kinds: tuple[str, ...] | None = None) -> list[Mutant]:
    """All single-site mutants of ``src`` from the chosen mutators (default: all)."""
    out: list[Mutant] = []
    for kind in kinds or tuple(MUTATORS):
        out.extend(MUTATORS[kind](src))
    return out


def sample(src: str, k: int, seed: int = 0, kinds: tuple[str, ...] | None = None) -> list[Mutant]:
    """``k`` mutants drawn without replacement, at least one per mutator kind if possible."""
    rng = random.Random(seed)
    by_kind: dict[str, list[Mutant]] = {}
    for mu in mutants(src, kinds):
        by_kind.setdefault(mu.kind, []).append(mu)
    picked: list[Mutant] = []
    for kind in sorted(by_kind):
        picked.append(rng.choice(by_kind[kind]))
    rest = [mu for ms in by_kind.values() for mu in ms if mu not in picked]
    rng.shuffle(rest)
    return (picked + rest)[:max(k, 0)] if k < len(picked) else picked + rest[:k - len(picked)]


# ---------------------------------------------------------------------------
# genome parameters

NB_CHOICES = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
CW_CHOICES = (8, 16, 32, 64, 128)
UNROLL_CHOICES = (1, 2, 4)
ORDER_CHOICES = ("row", "col")
STORAGE_CHOICES = ("f32", "f16")
#: Edits that change the algorithm on purpose (kept in the structure signature).
STRUCT_EDITS = ("nrm2_onepass", "no_rescale")
#: Edits that model mistakes (text mutator kinds); ``site`` picks which match.
BUG_EDITS = tuple(MUTATORS)

SEED_PARAMS = {"storage": "f32", "nb": 32, "cw": 64, "unroll": 1, "order": "row"}


#: A function definition at file scope (its name is group 1).
_DEF = re.compile(r"^(?:static\s+|KERNEL\s+)?\w[\w ]*?\b(\w+)\s*\([^;{]*\)\s*\{", re.M)


class RenderError(ValueError):
    """A genome asks for a hole or edit the seed source does not have."""


# ---------------------------------------------------------------------------
# genomes

def seed_genomes() -> list[dict]:
    """The starting points: the seed kernels with their default parameters."""
    out = [{"family": "geqrf", "params": dict(SEED_PARAMS), "edits": []},
           {"family": "geqr2", "params": dict(SEED_PARAMS), "edits": []},
           {"family": "geqrf", "params": dict(SEED_PARAMS, storage="f16"), "edits": []}]
    return [normalize(g) for g in out]


def normalize(genome: dict) -> dict:
    """Canonical form: parameters a family ignores get their seed value (dedup)."""
    g = copy.deepcopy(genome)
    p = {**SEED_PARAMS, **g.get("params", {})}
    if g["family"] == "geqr2":
        # geqr2 has no panel and no larfb: only the larf_left loop order matters.
        p.update(storage="f32", nb=SEED_PARAMS["nb"], cw=SEED_PARAMS["cw"],
                 unroll=SEED_PARAMS["unroll"])
    g["params"] = p
    g["edits"] = sorted(g.get("edits", []), key=lambda e: (e["op"], e.get("site", 0)))
    return g


def key(genome: dict) -> str:
    """Stable hash of a (normalized) genome."""
    return hashlib.sha256(json.dumps(normalize(genome), sort_keys=True).encode()).hexdigest()[:16]


def structure(genome: dict) -> str:
    """Structure signature (the idea group): everything but numeric tile parameters."""
    g = normalize(genome)
    p = g["params"]
    fam = g["family"] if g["family"] == "geqr2" else f"geqrf-{p['storage']}"
    ops = sorted({e["op"] for e in g["edits"]})
    return "|".join([fam, f"order={p['order']}"] + ops)


def describe(genome: dict) -> str:
    """One-line human description of a genome."""
    g = normalize(genome)
    p = g["params"]
    if g["family"] == "geqr2":
        s = f"geqr2 order={p['order']}"
    else:
        s = (f"geqrf/{p['storage']} nb={p['nb']} cw={p['cw']} u={p['unroll']} "
             f"order={p['order']}")
    for e in g["edits"]:
        s += f" +{e['op']}" + (f"@{e['site']}" if "site" in e else "")
    return s


def mutate(genome: dict, rng: random.Random, *, bug_rate: float = 0.15,
           struct_rate: float = 0.15, families: tuple[str, ...] = ("geqrf", "geqr2"),
           storages: tuple[str, ...] = STORAGE_CHOICES) -> dict:
    """A child of ``genome``: one parameter step, sometimes plus a source edit."""
    g = normalize(genome)
    p = g["params"]
    what = rng.choice(["nb", "nb", "nb", "cw", "cw", "unroll", "order", "storage", "family"])
    if what == "family" and len(families) > 1:
        g["family"] = rng.choice([f for f in families if f != g["family"]])
    elif what == "storage" and len(storages) > 1:
        p["storage"] = rng.choice([s for s in storages if s != p["storage"]])
    elif what == "order":
        p["order"] = "col" if p["order"] == "row" else "row"
    elif what == "unroll":
        p["unroll"] = rng.choice([u for u in UNROLL_CHOICES if u != p["unroll"]])
    elif what == "cw":
        p["cw"] = _step(CW_CHOICES, p["cw"], rng)
    else:
        p["nb"] = _step(NB_CHOICES, p["nb"], rng)
    r = rng.random()
    if r < struct_rate:
        op = rng.choice(STRUCT_EDITS)
        ops = {e["op"] for e in g["edits"]}
        if op in ops:  # toggling an algorithmic edit off is a move too
            g["edits"] = [e for e in g["edits"] if e["op"] != op]
        else:
            g["edits"].append({"op": op})
    elif r < struct_rate + bug_rate:
        g["edits"].append({"op": rng.choice(BUG_EDITS), "site": rng.randrange(1 << 16)})
    return normalize(g)


def _step(choices: tuple[int, ...], cur: int, rng: random.Random) -> int:
    """Move to a neighbouring value most of the time, anywhere sometimes."""
    if cur not in choices or rng.random() < 0.25:
        return rng.choice([c for c in choices if c != cur])
    i = choices.index(cur) + rng.choice((-1, 1))
    return choices[min(max(i, 0), len(choices) - 1)]


# ---------------------------------------------------------------------------
# rendering

def family_name(genome: dict) -> str:
    """The kernels.sources family a genome is built from."""
    g = normalize(genome)
    if g["family"] == "geqrf" and g["params"]["storage"] == "f16":
        return "geqrf_f16"
    return g["family"]


def render(genome: dict) -> tuple[str, str]:
    """(source, entry name) of a genome; RenderError if a hole is missing."""
    g = normalize(genome)
    p = g["params"]
    fam = family_name(g)
    try:
        src = sources.source(fam, "float32")
        entry = sources.entry(fam, "float32")
    except KeyError as e:
        raise RenderError(f"no seed family {fam!r}") from e
    if fam != "geqr2":
        src = _larfb_tile(src, p["cw"], p["unroll"])
    if p["order"] == "col":
        src = replace_function(src, "larf_left", LARF_LEFT_COL)
    # Drop helpers the entry point never calls first: edits then only land in
    # live code, and there is less to compile.
    src = prune(src, entry)
    for e in g["edits"]:
        src = apply_edit(src, e)
    return src, entry


def prune(src: str, entry: str) -> str:
    """Remove function definitions not reachable from ``entry`` (text-level call graph)."""
    names = [m.group(1) for m in _DEF.finditer(src)]
    spans = {n: function_span(src, n) for n in names}
    if entry not in spans or any(v is None for v in spans.values()):
        return src  # unexpected layout: leave it to the verifier
    body = {n: src[a:b] for n, (a, b) in spans.items()}  # type: ignore[misc]
    live, todo = set(), [entry]
    while todo:
        f = todo.pop()
        if f in live:
            continue
        live.add(f)
        text = body[f].split("(", 1)[1]  # skip the function's own name
        todo += [n for n in names if n not in live and re.search(rf"\b{n}\s*\(", text)]
    for n in sorted(set(names) - live, key=lambda n: -spans[n][0]):  # type: ignore[index]
        a, b = spans[n]  # type: ignore[misc]
        src = src[:a] + src[b:]
    return src


def function_span(src: str, name: str) -> tuple[int, int] | None:
    """(start, end) of the definition of function ``name`` in ``src``, or None.

    Text-level: the definition starts at the line declaring ``name(`` at file
    scope and ends at its matching closing brace.
    """
    m = re.search(rf"^(?:static\s+|KERNEL\s+)?\w[\w ]*?\b{re.escape(name)}\s*\(", src, re.M)
    if not m:
        return None
    brace = src.find("{", m.end())
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(src)):
        if src[i] == "{":
            depth += 1
        elif src[i] == "}":
            depth -= 1
            if depth == 0:
                return m.start(), i + 1
    return None


def replace_function(src: str, name: str, new_text: str) -> str:
    """Replace the definition of ``name`` by ``new_text`` (RenderError if absent)."""
    span = function_span(src, name)
    if span is None:
        raise RenderError(f"seed has no function {name!r}")
    return src[:span[0]] + new_text.strip("\n") + src[span[1]:]


def _map_functions(src: str, pred: Any, fn: Any) -> str:
    """Apply ``fn`` to the text of every function whose name satisfies ``pred``."""
    names = [m.group(1) for m in _DEF.finditer(src)]
    for name in dict.fromkeys(n for n in names if pred(n)):
        span = function_span(src, name)
        if span:
            src = src[:span[0]] + fn(src[span[0]:span[1]]) + src[span[1]:]
    return src


def _larfb_tile(src: str, cw: int, unroll: int) -> str:
    """Fill the tile-width and unroll holes of every larfb* function."""
    if function_span(src, "larfb") is None:
        raise RenderError("seed has no larfb (tile holes)")

    def fill(text: str) -> str:
        # The seed's column tile is the literal 64 (array extent, trip counts, chunk step).
        text = re.sub(r"\b64\b", str(cw), text)
        if unroll > 1:
            text = _unroll_fixed_loops(text, cw, unroll)
        return text

    return _map_functions(src, lambda n: n.startswith("larfb"), fill)


_FIXED_LOOP = re.compile(
    r"for \(int (?P<v>\w+) = 0; (?P=v) < (?P<n>\d+); (?P=v)\+\+\)(?P<ws>\s*)(?P<body>[^;{}]+;)")


def _unroll_fixed_loops(text: str, cw: int, u: int) -> str:
    """Unroll ``for (int l = 0; l < CW; l++) stmt;`` by ``u`` (CW % u == 0)."""

    def one(m: re.Match) -> str:
        n = int(m.group("n"))
        if n != cw or n % u:
            return m.group(0)
        v, body = m.group("v"), m.group("body").strip()
        copies = " ".join(re.sub(rf"\b{v}\b", f"({v} + {k})" if k else v, body)
                          for k in range(u))
        return f"for (int {v} = 0; {v} < {n}; {v} += {u}) {{ {copies} }}"

    return _FIXED_LOOP.sub(one, text)


# Column-order larf_left: for each column c, dot = v^T A[:, c], then the axpy
# down the column.  Same arithmetic as the seed's row-streaming order, but
# strided (cache-unfriendly) accesses: a loop-order mutation to explore.
LARF_LEFT_COL = """
static void larf_left(cap_t A, int64_t ld, int64_t col, int64_t r, int64_t m,
                      int64_t c0, int64_t c1, float tau, cap_t w)
{
    if (tau == 0.0f || c0 >= c1)
        return;
    for (int64_t c = c0; c < c1; c++) {
        float s = cap_load_f32(A, r * ld + c);
        for (int64_t i = r + 1; i < m; i++)
            s += cap_load_f32(A, i * ld + col) * cap_load_f32(A, i * ld + c);
        s = tau * s;
        cap_store_f32(w, c, s);
        cap_store_f32(A, r * ld + c, cap_load_f32(A, r * ld + c) - s);
        for (int64_t i = r + 1; i < m; i++)
            cap_store_f32(A, i * ld + c,
                          cap_load_f32(A, i * ld + c) - cap_load_f32(A, i * ld + col) * s);
    }
}
"""

# One-pass, unscaled 2-norm: squares overflow above ~1e19 and underflow below
# ~1e-19 in float32.  Faster on ordinary data; wrong on huge/tiny data.
NRM2_ONEPASS = """
static float nrm2_col(cap_t A, int64_t ld, int64_t col, int64_t i0, int64_t i1)
{
    float s = 0.0f;
    for (int64_t i = i0; i < i1; i++) {
        float x = cap_load_f32(A, i * ld + col);
        s += x * x;
    }
    return sqrtf(s);
}
"""

_RESCALE = re.compile(r"\n(\s*)if \(fabsf\(beta\) < safmin\) \{")


def _drop_rescale(src: str) -> str:
    """Remove the ``if (fabsf(beta) < safmin) { ... }`` block of larfg_col."""
    span = function_span(src, "larfg_col")
    if span is None:
        raise RenderError("seed has no larfg_col")
    body = src[span[0]:span[1]]
    m = _RESCALE.search(body)
    if not m:
        raise RenderError("larfg_col has no safmin rescaling block")
    depth, i = 0, body.index("{", m.start())
    for j in range(i, len(body)):
        depth += {"{": 1, "}": -1}.get(body[j], 0)
        if depth == 0:
            body = body[:m.start()] + body[j + 1:]
            break
    return src[:span[0]] + body + src[span[1]:]


def apply_edit(src: str, edit: dict) -> str:
    """Apply one source edit: a structural template or a text mutator (see the docstring)."""
    op = edit["op"]
    if op == "nrm2_onepass":
        return replace_function(src, "nrm2_col", NRM2_ONEPASS)
    if op == "no_rescale":
        return _drop_rescale(src)
    if op not in MUTATORS:
        raise RenderError(f"unknown edit {op!r}")
    sites = list(MUTATORS[op](src))
    if not sites:
        raise RenderError(f"no site for the {op} mutator")
    return sites[int(edit.get("site", 0)) % len(sites)].source


def storage_of(source: str) -> str:
    """'f16' if the kernel reads its matrix ``a`` in half precision, else 'f32'."""
    return "f16" if re.search(r"cap_(?:load|offset)_f16\(\s*a\s*,", source) else "f32"
