"""`venusrl sandbox ...`: exec one command in a fresh sandbox, serve node agents, bench."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
import yaml

from venusrl.config import ConfigError, load_config
from venusrl.logs import setup_logging

sandbox_app = typer.Typer(help="Sandboxes: run commands, serve node agents, benchmark density.", no_args_is_help=True)

TIMED_OUT_EXIT = 124  # what coreutils `timeout` returns


def _config(path: Path | None, overrides: list[str] | None):
    try:
        return load_config(path, overrides or []).sandbox
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None


def _template(spec: str):
    """A template name (`base`) or a YAML/JSON file describing one."""
    from pydantic import ValidationError

    from venusrl.sandbox.template import DEFAULT_TEMPLATE, Template

    if spec == DEFAULT_TEMPLATE.name:
        return DEFAULT_TEMPLATE
    path = Path(spec)
    if not path.is_file():
        typer.echo(f"--template: {spec!r} is neither 'base' nor a template file", err=True)
        raise typer.Exit(2)
    try:
        return Template.model_validate(yaml.safe_load(path.read_text()))
    except (ValidationError, yaml.YAMLError) as err:
        typer.echo(f"--template {spec}: {err}", err=True)
        raise typer.Exit(2) from None


def _image_template(image: str):
    from venusrl.sandbox.image.templates import image_template

    return image_template(image)


@sandbox_app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_command(
    command: Annotated[list[str], typer.Argument(help="the command and its arguments (after --)")],
    template: Annotated[str, typer.Option(help="'base' or a template YAML file")] = "base",
    image: Annotated[str | None, typer.Option(help="an imported image to run in (instead of --template)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds before the command's process tree is killed")] = 60.0,
    config: Annotated[Path | None, typer.Option(help="venusrl config YAML (its sandbox section)")] = None,
) -> None:
    """Run one command in a fresh sandbox, print its output, exit with its exit code."""
    from venusrl.sandbox.api import Sandbox
    from venusrl.sandbox.cluster import LocalCluster
    from venusrl.sandbox.errors import SandboxError

    if timeout <= 0:
        typer.echo("--timeout: must be > 0", err=True)
        raise typer.Exit(2)
    settings = _config(config, ["sandbox.nodes=1"])
    setup_logging(os.environ.get("VENUSRL_LOG_LEVEL", "WARNING"))
    spec = _template(template) if image is None else _image_template(image)
    os.environ.setdefault("VENUSRL_LOG_LEVEL", "WARNING")  # node agents: quiet unless asked
    try:
        cluster = LocalCluster(settings)
    except SandboxError as err:
        typer.echo(f"cannot start a node agent: {err}", err=True)
        raise typer.Exit(1) from None
    try:
        sandbox = Sandbox.create(cluster.controller, spec)
        result = sandbox.run(shlex.join(command), timeout=timeout)
    except SandboxError as err:
        typer.echo(f"sandbox error: {err}", err=True)
        raise typer.Exit(1) from None
    finally:
        cluster.close()
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        typer.echo(f"timed out after {timeout}s; the command's process tree was killed", err=True)
        raise typer.Exit(TIMED_OUT_EXIT)
    raise typer.Exit(result.exit_code if result.exit_code >= 0 else 128 - result.exit_code)


@sandbox_app.command("serve")
def serve(
    path: Annotated[Path | None, typer.Argument(help="venusrl config YAML; defaults when omitted")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted key=value overrides, e.g. sandbox.nodes=2")] = None,
    info: Annotated[Path, typer.Option(help="where to write the node addresses and token (mode 0600)")] = Path("sandbox-nodes.json"),
    e2b: Annotated[bool, typer.Option("--e2b", help="also serve E2B's protocol (REST API and envd), so code written "
                                      "for the e2b SDK runs here: set E2B_API_URL and E2B_SANDBOX_URL to the URL printed")] = False,
    e2b_host: Annotated[str, typer.Option(help="address the E2B service listens on")] = "127.0.0.1",
    e2b_port: Annotated[int, typer.Option(help="port of the E2B service (0: any free port)", min=0, max=65535)] = 49999,
) -> None:
    """Start the configured node agents and keep them up until interrupted."""
    from venusrl.sandbox.cluster import LocalCluster

    settings = _config(path, overrides)
    setup_logging("INFO")
    cluster = LocalCluster(settings)
    server = None
    try:
        record = {"token": cluster.token, "nodes": {n: p.address for n, p in cluster.nodes.items()}}
        if e2b:
            server = _start_e2b(cluster, settings.image_store, e2b_host, e2b_port)
            record["e2b"] = {"url": server.url, "api_key": server.service.api_key}
        fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2)
        typer.echo(f"{len(cluster.nodes)} node agents up; addresses and token in {info}")
        if server is not None:
            typer.echo(f"E2B protocol on {server.url}: export E2B_API_URL={server.url} E2B_SANDBOX_URL={server.url} "
                       f"E2B_API_KEY=<e2b.api_key in {info}>")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    finally:
        if server is not None:
            server.stop()
        cluster.close()
        info.unlink(missing_ok=True)


def _start_e2b(cluster, image_store: str, host: str, port: int):
    """The E2B service over the cluster's controller. Its API key is E2B_API_KEY when set
    (so clients configured for it keep working), else a fresh one."""
    import secrets

    from venusrl.sandbox.e2b.app import E2BServer
    from venusrl.sandbox.e2b.service import E2BService

    api_key = os.environ.get("E2B_API_KEY") or f"e2b_{secrets.token_hex(20)}"
    try:
        return E2BServer(E2BService(cluster.controller, api_key, image_store), host, port).start()
    except OSError as err:
        typer.echo(f"--e2b-port: cannot listen on {host}:{port}: {err.strerror}", err=True)
        raise typer.Exit(2) from None


@sandbox_app.command("bench")
def bench(
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
    quick: Annotated[bool, typer.Option(help="shorter settle times and a smaller burst node")] = False,
    node_memory: Annotated[str, typer.Option(help="node budget of the density runs")] = "2GiB",
    declared: Annotated[str, typer.Option(help="declared size of a sandbox")] = "512MiB",
    only: Annotated[str | None, typer.Option(help="run one case alone: warm_python, e2b")] = None,
) -> None:
    """Density (declared / actual / shared), lifecycle latency and OOM migration figures."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    from venusrl.bench.sandbox import run_bench

    try:
        budget = int(TypeAdapter(ByteSize).validate_python(node_memory))
        size = int(TypeAdapter(ByteSize).validate_python(declared))
    except ValidationError as err:
        typer.echo(f"--node-memory/--declared: {err.errors()[0]['msg']}", err=True)
        raise typer.Exit(2) from None
    setup_logging("INFO")
    os.environ.setdefault("VENUSRL_LOG_LEVEL", "WARNING")
    try:
        results = run_bench(quick, budget, size, json_out, only)
    except ValueError as err:  # --only names no case (checked before anything runs)
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({k: v for k, v in results.items() if k != "config"}, indent=2))


image_app = typer.Typer(help="Images: import OCI layouts and docker-archives into the layer store.", no_args_is_help=True)
sandbox_app.add_typer(image_app, name="image")


def _store(store: Path | None, config: Path | None):
    from venusrl.sandbox.image.store import ImageStore

    return ImageStore(store or _config(config, []).image_store)


@image_app.command("import")
def image_import(
    path: Annotated[Path, typer.Argument(help="an OCI image layout (directory or tar) or a `docker save` tarball")],
    name: Annotated[str | None, typer.Option(help="the name templates use (default: the file's tag)")] = None,
    ref: Annotated[str | None, typer.Option(help="which image, when the file holds several (tag or ref name)")] = None,
    store: Annotated[Path | None, typer.Option(help="layer store (default: sandbox.image_store)")] = None,
    config: Annotated[Path | None, typer.Option(help="venusrl config YAML (its sandbox section)")] = None,
) -> None:
    """Unpack an image's layers into the store (each layer once, by digest) and name it."""
    from venusrl.sandbox.errors import SandboxError

    setup_logging("INFO")
    try:
        result = _store(store, config).import_image(path, name, ref)
    except SandboxError as err:
        typer.echo(f"image import: {err}", err=True)
        raise typer.Exit(2) from None
    record = result.record
    typer.echo(json.dumps({"name": record.name, "image_id": record.image_id, "format": record.format,
                           "layers": len(record.layers), "new_layers": result.new_layers,
                           "shared_layers": result.shared_layers, "user": record.user,
                           "working_dir": record.working_dir, "command": list(record.command)}, indent=2))


@image_app.command("ls")
def image_list(
    store: Annotated[Path | None, typer.Option(help="layer store (default: sandbox.image_store)")] = None,
    config: Annotated[Path | None, typer.Option(help="venusrl config YAML (its sandbox section)")] = None,
) -> None:
    """The imported images: name, image ID, layers."""
    for record in _store(store, config).images():
        typer.echo(f"{record.name}\t{record.image_id[:19]}\t{len(record.layers)} layers\t{record.format}")


@image_app.command("rm")
def image_remove(
    name: Annotated[str, typer.Argument(help="the image's name")],
    store: Annotated[Path | None, typer.Option(help="layer store (default: sandbox.image_store)")] = None,
    config: Annotated[Path | None, typer.Option(help="venusrl config YAML (its sandbox section)")] = None,
) -> None:
    """Forget an image; delete the layers no other image shares."""
    from venusrl.sandbox.errors import SandboxError

    setup_logging("INFO")
    try:
        removed = _store(store, config).remove(name)
    except SandboxError as err:
        typer.echo(f"image rm: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"removed {name} and {removed} layers no other image used")
