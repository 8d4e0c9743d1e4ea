"""`daedalus host bundle|install|check`: carry a worker and the embedded server to a host with no network;
check a host before it takes work."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from daedalus.cli import host_check
from daedalus.cli._common import console, fail, settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Offline host bundles for air-gapped GPU hosts; a host's check of itself.",
)


@app.command()
def bundle(
    out: Annotated[Path, typer.Option("-o", "--out", help="a new directory for the bundle")],
    python: Annotated[
        str | None, typer.Option(help="the host's Python, e.g. 3.12 (default: this one)")
    ] = None,
    platform: Annotated[
        list[str] | None, typer.Option(help="wheel platform tags (repeatable; default manylinux x86_64)")
    ] = None,
    skip: Annotated[
        list[str] | None,
        typer.Option(help="packages the host already has (names, comma-separated, or a known host: h200)"),
    ] = None,
    temporal: Annotated[
        bool, typer.Option(help="ship the temporal binary (xz) for the embedded server")
    ] = True,
    bwrap: Annotated[
        bool, typer.Option(help="carry Debian's bubblewrap package (the agent sandbox) for a host without it")
    ] = True,
    max_mib: Annotated[float, typer.Option(help="refuse a bundle larger than this (0: no limit)")] = 64.0,
    refresh: Annotated[
        bool, typer.Option(help="OUT is a bundle already: rebuild only Daedalus's own wheel in it")
    ] = False,
) -> None:
    """Write wheels for the host's Python, the compressed temporal binary and an install script into OUT."""
    from daedalus.hosts.bundle import MIB, BundleError, BundleTarget, build_bundle, refresh_daedalus

    if refresh:
        try:
            manifest = refresh_daedalus(out)
        except BundleError as error:
            fail(str(error))
        console.print(f"refreshed daedalus in {out}: {int(manifest['total_bytes']) / MIB:.1f} MiB")  # type: ignore[call-overload]
        return
    try:
        target = BundleTarget(python=python) if python else BundleTarget()
        if platform:
            target = BundleTarget(python=target.python, platform=tuple(platform))
        manifest = build_bundle(out, target=target, skip=skip or [], with_temporal=temporal,
                                with_bwrap=bwrap, max_mib=max_mib or None, cache=settings().engines.cache_dir,
                                progress=lambda m: console.print(f"[dim]{m}[/dim]"))  # fmt: skip
    except BundleError as error:
        fail(str(error))
    total = int(manifest["total_bytes"])  # type: ignore[call-overload]
    console.print(f"bundle for Python {manifest['python']} at {out}: {len(manifest['pins'])} wheels + daedalus, "  # type: ignore[arg-type]
                  f"{total / MIB:.1f} MiB; left out (the host has them): "
                  f"{', '.join(manifest['skipped_present_on_target']) or 'nothing'}")  # type: ignore[arg-type]  # fmt: skip
    for line in manifest["shipped_over_image"]:  # type: ignore[attr-defined]
        console.print(f"shipped although the image has it: {line}")
    console.print(f"on the host: daedalus host install {out}   or   sh {out}/install.sh")


@app.command()
def install(
    bundle_dir: Annotated[Path, typer.Argument(help="a directory written by `daedalus host bundle`")],
    venv: Annotated[Path | None, typer.Option(help="the new virtualenv (default: BUNDLE/venv)")] = None,
    python: Annotated[str | None, typer.Option(help="the interpreter to build the venv with")] = None,
) -> None:
    """Install a bundle with no network: a venv that sees the system's packages, wheels, temporal."""
    from daedalus.hosts.bundle_install import BundleError, install_bundle

    try:
        script = install_bundle(bundle_dir, venv or bundle_dir / "venv", python=python,
                                progress=lambda m: console.print(f"[dim]{m}[/dim]"))  # fmt: skip
    except BundleError as error:
        fail(str(error))
    console.print(f"installed: {script}")


app.command("check")(host_check.check)
