"""Every example a user may copy is valid: tickets, engine presets, training runs."""

from pathlib import Path

import pytest
import yaml

from daedalus.client import load_spec
from daedalus.engines.presets import load_preset
from daedalus.errors import TicketError
from daedalus.schemas.training import TrainingRunSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("path", sorted((EXAMPLES / "tickets").glob("*.yaml")), ids=lambda p: p.name)
def test_ticket_examples_validate(path: Path) -> None:
    spec = load_spec(path)
    assert spec.gates or spec.children


def test_seed_ticket_six_has_its_sub_tickets_in_order() -> None:
    spec = load_spec(EXAMPLES / "tickets" / "6-tp4-mtp.yaml")
    assert [child.id for child in spec.with_parent()] == ["6b", "6c", "6d", "6e", "6f"]
    assert all(child.parent == "6" for child in spec.with_parent())


@pytest.mark.parametrize("path", sorted((EXAMPLES / "presets").glob("*.yaml")), ids=lambda p: p.name)
def test_preset_examples_validate(path: Path) -> None:
    assert load_preset(path).name == path.stem


@pytest.mark.parametrize("path", sorted((EXAMPLES / "training").glob("*.yaml")), ids=lambda p: p.name)
def test_training_examples_validate(path: Path) -> None:
    TrainingRunSpec.model_validate(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("id: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "must be a mapping"),
        (
            "id: '4'\ntitle: t\nhost: mavis\ncolour: blue\ngates: []\n",
            "colour: Extra inputs are not permitted",
        ),
        (
            "id: '4'\ntitle: t\nhost: mavis\ngates:\n  - {name: g, metric: tokens_per_joule, threshold: 1, command: x}\n",
            "gates.0.metric",
        ),
        ("id: 'bad id!'\ntitle: t\nhost: mavis\n", "id: String should match pattern"),
    ],
)
def test_bad_spec_files_are_refused_with_the_field_path(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "ticket.yaml"
    path.write_text(text)
    with pytest.raises(TicketError, match=words.replace("[", r"\[")):
        load_spec(path)
