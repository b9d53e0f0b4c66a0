"""Which rules exist and which a check runs: built-in, user folders, entry points.

    rules = load_rules(select=("SA3",), ignore=("SA305",), dirs=["my_rules/"])

Built-in rules are every Rule subclass in a module of this package whose name
starts with `sa` (sa1_shapes.py, sa3_path.py, ..., and sa7_*.py for engine logs and
metrics). A user folder is a directory of .py files, each imported as a module; an
entry point is any object in the `specaudit.invariants` group: a module, a Rule
subclass, or a list of them.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

from specaudit.trace.safe_io import InputError

from .base import DEFINED, Rule, RuleError

ENTRY_POINT_GROUP = "specaudit.invariants"
_BUILTIN_LOADED = False


def load_builtin() -> None:
    global _BUILTIN_LOADED
    if _BUILTIN_LOADED:
        return
    pkg = importlib.import_module(__package__)
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("sa"):
            importlib.import_module(f"{__package__}.{info.name}")
    _BUILTIN_LOADED = True


def builtin_codes() -> set[str]:
    load_builtin()
    return {c for c, cls in DEFINED.items() if cls.__module__.startswith(__package__ + ".")}


MAX_RULE_FILE_BYTES = 4 << 20   # a rule file is source code: KBs


def load_dir(path) -> list[str]:
    """Import every .py file of a folder (not starting with '_'); return the new codes."""
    d = Path(path)
    if not d.is_dir():
        raise InputError(d, "--invariants expects a folder of .py rule files")
    before = set(DEFINED)
    files = sorted(p for p in d.glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise InputError(d, "no .py rule files in this folder")
    for f in files:
        tag = hashlib.sha1(str(f.resolve()).encode()).hexdigest()[:12]
        modname = f"specaudit_user_invariants.{f.stem}_{tag}"
        if modname in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(modname, f)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        try:
            # read through the one input opener (a FIFO or a device named *.py is refused, not
            # waited on), then run that text: nothing is re-opened between the check and the read
            from specaudit.inputs import read_input_text
            src = read_input_text(f, MAX_RULE_FILE_BYTES, "--invariants")
            exec(compile(src, str(f), "exec"), mod.__dict__)
        except InputError:
            del sys.modules[modname]
            raise
        except RuleError as e:
            del sys.modules[modname]
            raise InputError(f, f"bad rule: {e}") from None
        except Exception as e:  # a user's file: report it in one line, never a traceback
            del sys.modules[modname]
            raise InputError(f, f"cannot import rule file: {type(e).__name__}: {e}") from None
    return sorted(set(DEFINED) - before)


def load_entry_points() -> list[str]:
    """Load the `specaudit.invariants` entry points of installed packages."""
    from importlib.metadata import entry_points
    before = set(DEFINED)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:
            raise InputError(None, f"entry point {ep.name!r} ({ep.value}) of group "
                                   f"{ENTRY_POINT_GROUP}: {type(e).__name__}: {e}") from None
        # a module or class registers itself on import; a list of classes too
        if isinstance(obj, (list, tuple)):
            for o in obj:
                if not (isinstance(o, type) and issubclass(o, Rule)):
                    raise InputError(None, f"entry point {ep.name!r}: {o!r} is not a Rule subclass")
    return sorted(set(DEFINED) - before)


def matches(code: str, prefixes) -> bool:
    return any(code.startswith(p.strip().upper()) for p in prefixes if p.strip())


def load_rules(select=(), ignore=(), dirs=(), entry_points: bool = True) -> list[Rule]:
    """Instances of the rules a check runs, sorted by code.

    select/ignore are code prefixes ("SA3", "SA301"); empty select means all.
    """
    load_builtin()
    for d in dirs or ():
        load_dir(d)
    if entry_points:
        load_entry_points()
    out = []
    for code in sorted(DEFINED):
        if select and not matches(code, select):
            continue
        if ignore and matches(code, ignore):
            continue
        out.append(DEFINED[code]())
    return out


def get_rule(code: str) -> Rule | None:
    load_builtin()
    cls = DEFINED.get(code.strip().upper())
    return cls() if cls else None


def all_rules() -> list[Rule]:
    return load_rules(entry_points=False)


def check_selectors(option: str, prefixes, codes=None) -> None:
    """Every --select/--ignore entry must be a code or a prefix of at least one known code
    (after the user's rules are loaded); ValueError naming the closest codes otherwise, so a
    typo in CI cannot turn a check into "No violations"."""
    import difflib
    known = sorted(codes if codes is not None else DEFINED)
    for p in prefixes or ():
        p = p.strip().upper()
        if not p or any(c.startswith(p) for c in known):
            continue
        cand = [f"SA{p}"] if p.isdigit() and f"SA{p}" in known else []
        if not cand and p.isdigit():
            cand = [c for c in known if c.startswith(f"SA{p}")][:3]
        cand = cand or difflib.get_close_matches(p, known, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(cand)}?" if cand else "; `specaudit rules` lists the codes"
        raise ValueError(f"{option} {p}: no rule has this code or prefix{hint}")


def live_rules(where: str) -> list[Rule]:
    """Built-in rules that also run live at `where`: "prom" (the Prometheus sink's inline
    rules) or "kernel" (the fused kernel's flags; rule.live holds "kernel:<flag>"), by code."""
    load_builtin()
    return [DEFINED[c]() for c in sorted(DEFINED)
            if any(x == where or x.startswith(where + ":") for x in DEFINED[c].live)]


def kernel_codes() -> dict:
    """The fused kernel's flag -> the catalog codes it reports (from each rule's `live`)."""
    out: dict = {}
    for r in live_rules("kernel"):
        for x in r.live:
            if x.startswith("kernel:"):
                out.setdefault(x.split(":", 1)[1], []).append(r.code)
    return {k: tuple(v) for k, v in out.items()}


def what(rule: Rule) -> str:
    """The first sentence of a rule's "What:" paragraph (a one-line description)."""
    doc = " ".join((type(rule).__doc__ or "").split())
    text = doc.split("What:", 1)[1] if "What:" in doc else doc
    text = text.split(" Why:", 1)[0].strip()
    return text.split(". ")[0].rstrip(".")
