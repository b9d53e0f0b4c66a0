"""specaudit: make the metrics of speculative decoding trustworthy."""
__version__ = "0.1.0"

# One package, two places. The repository keeps the catalog (invariants/), the Triton
# kernels (kernels/) and the dashboards (dashboards/) at its top level, by design; a
# wheel installs them as specaudit.invariants, specaudit.kernels, specaudit.dashboards
# (pyproject's package-dir). Run from a clone's root (`python -m specaudit`, tests,
# scripts), Python imports this source folder instead of the installed copy, so the
# three folders must be found beside it: we add only those three to this package's
# search path, by name, and only when this is the source tree (pyproject.toml beside
# it and no installed copy of them inside it). A symlink would do the same on POSIX
# but not on Windows checkouts, and a second installed copy would hide local edits.
# The other way round, a top-level import of one of those names (Hugging Face's `kernels`,
# which transformers imports) finds an installed package first: _installed below.
def _source_tree_subpackages() -> None:
    import importlib.machinery
    import importlib.util
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    root = here.parent
    names = ("invariants", "kernels", "dashboards")
    if not (root / "pyproject.toml").is_file() or any((here / n).is_dir() for n in names):
        return

    class _TopLevelFolders(importlib.machinery.PathFinder):
        """Finds specaudit.<name> for the three top-level folders of a source tree."""

        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if fullname in names and path is None:
                return cls._installed(fullname)
            pkg, _, leaf = fullname.partition(".")
            if pkg != __name__ or leaf not in names:
                return None
            init = root / leaf / "__init__.py"
            if not init.is_file():
                return None
            return importlib.util.spec_from_file_location(
                fullname, init, submodule_search_locations=[str(root / leaf)])

        @classmethod
        def _installed(cls, name):
            """A top-level `kernels` (or `invariants`, `dashboards`) installed elsewhere on
            the path, or None. Run from the clone's root, the root is on sys.path and its
            folders would answer for those names: transformers >= 5.25 imports Hugging
            Face's `kernels` package and got ours (ImportError on every model load). Ours
            stay specaudit.<name>; a top-level name goes to our folder only when nothing
            else on the path has it (the tests' `from dashboards import engines`)."""
            elsewhere = []
            for p in sys.path:
                try:
                    if Path(p or ".").resolve() != root:
                        elsewhere.append(p)
                except OSError:
                    elsewhere.append(p)
            return importlib.machinery.PathFinder.find_spec(name, elsewhere)

    if not any(getattr(f, "__name__", "") == "_TopLevelFolders" for f in sys.meta_path):
        sys.meta_path.insert(0, _TopLevelFolders)


_source_tree_subpackages()
del _source_tree_subpackages
