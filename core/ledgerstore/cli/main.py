"""The ``ledgerstore`` command line."""

from __future__ import annotations

import dataclasses
import json
import platform
import sys

import click

from ledgerstore import __version__
from ledgerstore.cli.common import emit, handle_errors, run_async, setup_logging


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True,
             no_args_is_help=True)
@click.option("--version", "show_version", is_flag=True, help="Show the version and exit.")
@click.option("--verbose", "-v", is_flag=True, help="with --version: the Python and the hot path too")
@click.pass_context
def cli(ctx: click.Context, show_version: bool, verbose: bool) -> None:
    """ledgerstore: BookKeeper's replicated log in Python, every backend a plugin."""
    if show_version:
        click.echo(f"ledgerstore, version {__version__}")
        if verbose:
            from ledgerstore.proto import speedups

            click.echo(f"python {platform.python_version()} ({sys.executable})")
            click.echo(f"hot path: {speedups.state}")
        ctx.exit()
    if ctx.invoked_subcommand is None:
        raise click.UsageError("a command is needed (ledgerstore --help lists them)")


@cli.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True, help="bookie TOML file")
@click.option("--log-level", default="INFO", show_default=True)
@handle_errors
def bookie(config_path: str, log_level: str) -> None:
    """Run one bookie from a config file until SIGTERM/Ctrl-C."""
    from ledgerstore.bookie.server import run_bookie
    from ledgerstore.config import load_bookie_config
    from ledgerstore.runtime import install_fast_loop, tune_gc

    setup_logging(log_level)
    cfg = load_bookie_config(config_path)
    install_fast_loop()
    tune_gc()
    run_async(run_bookie(cfg, ready=lambda b: print(f"bookie {b.bookie_id} ready", flush=True)))


@cli.command()
@handle_errors
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def plugins(as_json: bool) -> None:
    """List every installed backend and hook implementation with its distribution, and which hot
    path runs (compiled, or pure Python and why)."""
    from ledgerstore.plugins import describe_plugins, hooks
    from ledgerstore.proto import speedups

    rows = [dataclasses.asdict(p) for p in describe_plugins()]
    for plugin in hooks().get_plugins():
        name = hooks().get_name(plugin) or repr(plugin)
        impls = [h.name for h in hooks().get_hookcallers(plugin) or []]
        if not any(r["slot"] == "hooks" and r["name"] == name for r in rows):
            rows.append({"slot": "hooks", "name": name, "target": ", ".join(impls), "distribution": "", "version": "", "error": ""})
    for r in rows:
        r["status"] = "ok" if not r["error"] else f"broken: {r['error']}"
    if as_json:
        hot = speedups.state
        rows.append({"slot": "hot path", "name": "compiled" if hot.compiled else "pure Python",
                     "target": "ledgerstore.proto._speedups", "distribution": "ledgerstore", "version": __version__,
                     "error": "", "status": "ok" if hot.compiled else hot.reason})
    emit(rows, as_json, ["slot", "name", "target", "distribution", "version", "status"], title="ledgerstore plugins")
    if not as_json:
        click.echo(f"hot path: {speedups.state}")


@cli.group("config")
def config_group() -> None:
    """Configuration files."""


@config_group.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--kind", type=click.Choice(["bookie", "client"]), default=None,
              help="which config the file holds (default: from its [bookie]/[client] table)")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def config_check(path: str, kind: str | None, as_json: bool) -> None:
    """Validate a config file and print the effective configuration."""
    import tomllib

    from ledgerstore.config import BookieConfig, ClientConfig, load, to_toml

    if kind is None:
        try:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            from ledgerstore.errors import ConfigError

            raise ConfigError(f"{path}: {exc}") from None
        kind = "client" if "client" in raw and "bookie" not in raw else "bookie"
    cls = BookieConfig if kind == "bookie" else ClientConfig
    cfg = load(cls, kind, path)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(cfg), indent=2))
    else:
        click.echo(f"# {path}: valid {kind} configuration; effective values:")
        click.echo(to_toml(cfg, kind))


def _register_subcommands() -> None:
    from ledgerstore.cli import bench, credentials, shell, sim, standalone

    cli.add_command(standalone.standalone)
    cli.add_command(credentials.credentials)
    cli.add_command(sim.sim)
    cli.add_command(shell.shell)
    cli.add_command(bench.bench)
    try:
        from ledgerstore.cli import autorecovery
    except ModuleNotFoundError as exc:  # pragma: no cover - only while the module is being written
        if exc.name != "ledgerstore.cli.autorecovery":
            raise
    else:
        cli.add_command(autorecovery.autorecovery)
    from ledgerstore.plugins import hooks

    for cmds in hooks().hook.ledgerstore_cli_commands():
        for c in cmds or []:
            cli.add_command(c)
    for cmds in hooks().hook.ledgerstore_shell_commands():
        for c in cmds or []:
            shell.shell.add_command(c)


def main() -> None:
    _register_subcommands()
    cli(prog_name="ledgerstore")


if __name__ == "__main__":
    main()
    sys.exit(0)
