"""Genomes, their mutation, and rendering a genome to kernel source.

A *genome* is a small JSON-able dict::

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
* risky edits, as an LLM or a careless human makes them: loop bound
  off-by-one (``<`` to ``<=``, ``< e`` to ``< e - 1``), swapped row/column
  in an index, an origin moved by one element.  Most of these fault (the
  checked runtime refuses the access) or fail the checker.

Holes are found by pattern in the seed text; a hole that the current seed
does not have makes that mutation unavailable (never a crash).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
from typing import Any

from kernels import sources

NB_CHOICES = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
CW_CHOICES = (8, 16, 32, 64, 128)
UNROLL_CHOICES = (1, 2, 4)
ORDER_CHOICES = ("row", "col")
STORAGE_CHOICES = ("f32", "f16")
#: Edits that change the algorithm on purpose (kept in the structure signature).
STRUCT_EDITS = ("nrm2_onepass", "no_rescale")
#: Edits that model mistakes; ``site`` picks which match of the pattern.
BUG_EDITS = ("bound_le", "bound_short", "swap_index", "offset_plus")

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
    except Exception as e:  # the kernels package is still being written: not our bug
        raise RenderError(f"seed family {fam!r} unavailable: {e}") from None
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


_FOR_LT = re.compile(r"(for \([^;]*; *\w+ )<( *)([^;]+);")
_INDEX = re.compile(r"\((\w+), \(?(\w+)\)? \* (\w+) \+ (\w+)\)")
_OFFSET = re.compile(r"cap_offset_f(16|32)\((\w+), ([^;]+?)\);")


def apply_edit(src: str, edit: dict) -> str:
    """Apply one source edit (see the module docstring)."""
    op = edit["op"]
    if op == "nrm2_onepass":
        return replace_function(src, "nrm2_col", NRM2_ONEPASS)
    if op == "no_rescale":
        return _drop_rescale(src)
    site = int(edit.get("site", 0))
    if op in ("bound_le", "bound_short"):
        ms = list(_FOR_LT.finditer(src))
        if not ms:
            raise RenderError("no 'for (...; i < n; ...)' loops to edit")
        m = ms[site % len(ms)]
        if op == "bound_le":
            new = f"{m.group(1)}<={m.group(2)}{m.group(3)};"
        else:
            new = f"{m.group(1)}<{m.group(2)}({m.group(3)}) - 1;"
        return src[:m.start()] + new + src[m.end():]
    if op == "swap_index":
        ms = list(_INDEX.finditer(src))
        if not ms:
            raise RenderError("no 'cap, i * ld + j' indices to edit")
        m = ms[site % len(ms)]
        cap, i, ld, j = m.groups()
        return src[:m.start()] + f"({cap}, {j} * {ld} + {i})" + src[m.end():]
    if op == "offset_plus":
        ms = list(_OFFSET.finditer(src))
        if not ms:
            raise RenderError("no cap_offset calls to edit")
        m = ms[site % len(ms)]
        return (src[:m.start()] + f"cap_offset_f{m.group(1)}({m.group(2)}, {m.group(3)} + 1);"
                + src[m.end():])
    raise RenderError(f"unknown edit {op!r}")


def storage_of(source: str) -> str:
    """'f16' if the kernel reads its matrix ``a`` in half precision, else 'f32'."""
    return "f16" if re.search(r"cap_(?:load|offset)_f16\(\s*a\s*,", source) else "f32"
