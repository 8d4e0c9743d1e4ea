"""A sub-ticket of an approved dispatch does not ask again: the parent's request listed its commands too."""

from __future__ import annotations

from pathlib import Path

from daedalus.decisions.schemas import DispatchRule
from daedalus.workflows.ticket_rules import child_dispatch
from tests.support import ticket_spec


def test_children_of_an_approved_dispatch_run_on_it(tmp_path: Path) -> None:
    child = ticket_spec(tmp_path / "repo", "mavis", approval={})  # an agent, approval required by its spec
    asked = DispatchRule(
        required=True, excluded=["alice"], commands=["..."], reason="alice does not operate mavis"
    )
    covered = child_dispatch(asked, child, covered_by_parent=True)
    assert covered is not None and not covered.required and covered.covered and covered.excluded == ["alice"]
    assert "runs on its parent's approved dispatch" in covered.reason
    # A grandchild is covered through its covered parent.
    grandchild = child_dispatch(covered, child, covered_by_parent=True)
    assert grandchild is not None and not grandchild.required
    # Histories before the patch: each agent sub-ticket asked again.
    before = child_dispatch(asked, child, covered_by_parent=False)
    assert before is not None and before.required
    # A parent that never asked (its filer operates the host) covers nothing: the child's own spec decides.
    operator = DispatchRule(required=False, commands=[], reason="olga operates mavis")
    own = child_dispatch(operator, child, covered_by_parent=True)
    assert own is not None and own.required
    assert child_dispatch(None, child, covered_by_parent=True) is None
