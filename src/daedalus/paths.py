"""Paths built from filed names (ticket ids, gate names), proven to stay under the directory they belong to."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this package was imported from (its pyproject.toml, src/, examples/, tools/), named here and
nowhere else. An installed Daedalus (a wheel, a host's venv) has none: code that needs one says so (see
daedalus.hosts.bundle.source_checkout)."""


class UnsafePathError(ValueError):
    """A name would place a file outside its directory (`..`, an absolute path, a symlink out)."""


def contained(root: Path, *parts: str) -> Path:
    """`root / parts...`, refused unless it resolves to a path under `root` resolved.

    The schemas already restrict ids and gate names to slugs; this is the second fence, for names from
    stored histories and for symlinks planted inside the directory.
    """
    base = root.resolve()
    resolved = base.joinpath(*parts).resolve()
    if not resolved.is_relative_to(base) or resolved == base:
        raise UnsafePathError(
            f"{'/'.join(parts)!r} would leave {base}; names of tickets and gates may hold only letters, digits, "
            f"'.', '_' and '-'"
        )
    return root.joinpath(*parts)
