"""`specaudit check`'s settings kept in the repository: `[tool.specaudit]` or `specaudit.toml`.

    [tool.specaudit]                      # pyproject.toml (specaudit.toml: the same keys at top level)
    select = ["SA3", "SA5", "SA7"]        # code prefixes, as --select
    ignore = ["SA311"]                    # as --ignore
    output-format = "github"              # as --output-format
    [tool.specaudit.per-path-ignores]     # glob (relative to this file's folder) -> codes
    "traces/legacy/*" = ["SA5"]
    [tool.specaudit.severity]             # code or prefix -> error | warning | info
    SA709 = "error"
    [tool.specaudit.tolerances]
    throughput = 0.15                     # SA708: reported commit length vs the throughput estimate band

Found as ruff finds its configuration: from the working directory upwards, the first
folder holding a specaudit.toml, or a pyproject.toml with a [tool.specaudit] table, wins
(specaudit.toml before pyproject.toml in one folder). `--config PATH` names the file,
`--isolated` ignores every file. Flags override the file: --select replaces `select`,
--ignore replaces `ignore`, --output-format replaces `output-format`.

Bad configuration is an input error naming the file and the key (exit 2): an unknown key
(with the closest known one), a wrong type, a code no rule has, a per-path pattern that
matches nothing under the file's folder. Standard library only (tomllib; tomli on 3.10),
so `check --help` stays fast.
"""
from __future__ import annotations

import difflib
import fnmatch
import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

KEYS = ("select", "ignore", "per-path-ignores", "severity", "output-format", "tolerances")
SEVERITIES = ("error", "warning", "info")
OUTPUT_FORMATS = ("text", "json", "junit", "github", "sarif")
# tolerance name -> (rule module under specaudit.invariants, its constant, lowest, highest, meaning)
TOLERANCES = {
    "throughput": ("sa7xx_throughput", "TOLERANCE", 0.0, 1.0,
                   "SA708: relative slack around the throughput estimate's band (default 0.1)"),
    "acceptance-shift": ("sa7xx_throughput", "SHIFT", 0.0, 10.0,
                         "SA709: relative change in acceptance between windows that is reported (default 0.2)"),
}
FILE_NAME = "specaudit.toml"


class ConfigError(ValueError):
    """A configuration file's problem, in one line naming the file and the key."""

    def __init__(self, path, key: str | None, reason: str, table: str = ""):
        where = f"{table} " if table else ""
        super().__init__(f"{path}: {where}{key + ': ' if key else ''}{reason}")


@dataclass
class CheckConfig:
    """The settings of one file (all empty when none applies)."""

    path: Path | None = None          # the file read
    table: str = ""                   # "[tool.specaudit]" in a pyproject.toml, "" in specaudit.toml
    select: tuple | None = None
    ignore: tuple | None = None
    per_path_ignores: list = field(default_factory=list)   # [(glob, (codes...))]
    severity: dict = field(default_factory=dict)            # code prefix -> severity
    output_format: str | None = None
    tolerances: dict = field(default_factory=dict)          # name -> float

    @property
    def root(self) -> Path | None:
        return self.path.parent if self.path is not None else None

    def label(self, key: str) -> str:
        """How an error names one key: 'pyproject.toml: [tool.specaudit] select'."""
        return f"{self.path}: {self.table + ' ' if self.table else ''}{key}"

    def code_lists(self) -> list[tuple[str, tuple]]:
        """(label, codes) for every code the file names: checked against the rules that exist."""
        out = []
        if self.select:
            out.append((self.label("select"), self.select))
        if self.ignore:
            out.append((self.label("ignore"), self.ignore))
        for pat, codes in self.per_path_ignores:
            out.append((self.label(f"per-path-ignores {pat!r}"), codes))
        if self.severity:
            out.append((self.label("severity"), tuple(self.severity)))
        return out

    # --------------------------------------------------------- applying it to findings

    def severity_of(self, code: str, default: str) -> str:
        """The longest matching prefix's severity, else `default`."""
        best = max((p for p in self.severity if code.startswith(p)), key=len, default=None)
        return self.severity[best] if best is not None else default

    def path_ignored(self, code: str, file: str | None) -> bool:
        """Whether a finding of `code` about `file` falls under a per-path ignore."""
        if not self.per_path_ignores or not file or self.root is None:
            return False
        rel = _relative(file, self.root)
        if rel is None:
            return False
        return any(_matches(rel, pat) and any(code.startswith(c) for c in codes)
                   for pat, codes in self.per_path_ignores)


def _relative(file: str, root: Path) -> str | None:
    """file relative to root in POSIX spelling, or None when it lies outside (or is a URL)."""
    if "://" in str(file):
        return None
    rel = os.path.relpath(os.path.abspath(file), os.path.abspath(root))
    return None if rel == ".." or rel.startswith(".." + os.sep) else Path(rel).as_posix()


def _matches(rel: str, pat: str) -> bool:
    """ruff-like: the path or one of its folders matches; a pattern without '/' also
    matches the last name of the path or of a folder on it."""
    parts = rel.split("/")
    for i in range(len(parts), 0, -1):
        head = "/".join(parts[:i])
        if fnmatch.fnmatchcase(head, pat) or ("/" not in pat and fnmatch.fnmatchcase(parts[i - 1], pat)):
            return True
    return False


# ------------------------------------------------------------------ finding the file


def _toml():
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        import tomli as tomllib
    return tomllib


def _read(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return _toml().load(f)
    except FileNotFoundError:
        raise ConfigError(path, None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(path, None, "is a folder, not a TOML file") from None
    except OSError as e:
        raise ConfigError(path, None, f"cannot read: {e.strerror or e}") from None
    except ValueError as e:   # tomllib.TOMLDecodeError
        raise ConfigError(path, None, f"not valid TOML: {e}") from None


def _table(path: Path, data: dict) -> tuple[dict | None, str]:
    """The settings table of a parsed file and how errors name it."""
    if path.name == "pyproject.toml":
        tool = data.get("tool")
        tab = tool.get("specaudit") if isinstance(tool, dict) else None
        if tab is not None and not isinstance(tab, dict):
            raise ConfigError(path, None, "[tool.specaudit] must be a table")
        return tab, "[tool.specaudit]"
    return data, ""


def find_config(start: str | os.PathLike | None = None) -> Path | None:
    """The file that applies in `start` (default: the working directory), walking up."""
    d = Path(start or os.getcwd()).absolute()
    for folder in (d, *d.parents):
        own = folder / FILE_NAME
        if own.is_file():
            return own
        py = folder / "pyproject.toml"
        if py.is_file():
            try:
                tab, _ = _table(py, _read(py))
            except ConfigError:
                tab = None   # someone else's broken pyproject.toml is not ours to judge
            if tab is not None:
                return py
    return None


def load_config(path, *, required: bool = True) -> CheckConfig:
    """Parse and check one file (everything but the codes: those need the loaded rules)."""
    path = Path(path)
    tab, table = _table(path, _read(path))
    if tab is None:
        if required:
            raise ConfigError(path, None, "has no [tool.specaudit] table")
        return CheckConfig()
    cfg = CheckConfig(path=path, table=table)
    for key, val in tab.items():
        if key not in KEYS:
            close = difflib.get_close_matches(key.replace("_", "-"), KEYS, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else f" (known keys: {', '.join(KEYS)})"
            raise ConfigError(path, key, f"unknown key{hint}", table)
        if key in ("select", "ignore"):
            setattr(cfg, key, _codes(path, key, val, table))
        elif key == "output-format":
            if val not in OUTPUT_FORMATS:
                raise ConfigError(path, key, f"{val!r}: expected one of {', '.join(OUTPUT_FORMATS)}", table)
            cfg.output_format = val
        elif key == "per-path-ignores":
            cfg.per_path_ignores = _per_path(path, val, table)
        elif key == "severity":
            cfg.severity = _severity(path, val, table)
        elif key == "tolerances":
            cfg.tolerances = _tolerances(path, val, table)
    return cfg


def _codes(path, key, val, table) -> tuple:
    if not isinstance(val, list) or not all(isinstance(c, str) and c.strip() for c in val):
        raise ConfigError(path, key, 'expected a list of code prefixes, e.g. ["SA3", "SA501"]', table)
    return tuple(c.strip().upper() for c in val)


def _per_path(path, val, table) -> list:
    if not isinstance(val, dict):
        raise ConfigError(path, "per-path-ignores", 'expected a table: "glob" = ["codes"]', table)
    root = path.parent
    out = []
    for pat, codes in val.items():
        key = f"per-path-ignores {pat!r}"
        codes = _codes(path, key, codes, table)
        if not _exists(root, pat):
            raise ConfigError(path, key, f"the pattern matches no file or folder under {root}", table)
        out.append((pat, codes))
    return out


def _exists(root: Path, pat: str) -> bool:
    """Whether the glob names anything under root (a pattern without '/' anywhere below it)."""
    pats = [pat] if "/" in pat else [pat, f"**/{pat}"]
    for p in pats:
        if next(glob.iglob(p, root_dir=root, recursive=True), None) is not None:
            return True
    return False


def _severity(path, val, table) -> dict:
    if not isinstance(val, dict):
        raise ConfigError(path, "severity", 'expected a table: CODE = "error" | "warning" | "info"', table)
    out = {}
    for code, sev in val.items():
        if sev not in SEVERITIES:
            raise ConfigError(path, f"severity {code}", f"{sev!r}: expected one of {', '.join(SEVERITIES)}", table)
        out[code.strip().upper()] = sev
    return out


def _tolerances(path, val, table) -> dict:
    if not isinstance(val, dict):
        raise ConfigError(path, "tolerances", "expected a table: name = number", table)
    out = {}
    for name, x in val.items():
        key = f"tolerances {name}"
        if name not in TOLERANCES:
            close = difflib.get_close_matches(name, TOLERANCES, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else f" (known: {', '.join(TOLERANCES)})"
            raise ConfigError(path, key, f"unknown tolerance{hint}", table)
        lo, hi = TOLERANCES[name][2:4]
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not lo <= x <= hi:
            raise ConfigError(path, key, f"{x!r}: expected a number from {lo:g} to {hi:g}", table)
        out[name] = float(x)
    return out


def resolve(config: str | None = None, isolated: bool = False, cwd=None) -> CheckConfig:
    """The settings that apply: --isolated none, --config PATH that file, else the one found."""
    if isolated and config:
        raise ValueError("--config and --isolated exclude each other")
    if isolated:
        return CheckConfig()
    if config:
        return load_config(config)
    found = find_config(cwd)
    return load_config(found) if found is not None else CheckConfig()
