"""``ledgerstore bench``: write and read throughput/latency benchmarks.

Against an existing cluster (``--metadata URI``) or, without it, against a cluster of
``--bookies`` bookie processes started in a temporary directory and stopped afterwards.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ledgerstore.cli.common import EXIT_FAILED, cluster_client, emit, err_console, handle_errors, run_async

T = TypeVar("T")


def _cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--storage", default="entrylog", show_default=True,
                      help="storage engine of the bookies started without --metadata")(fn)
    fn = click.option("--bookies", default=3, show_default=True, type=click.IntRange(1),
                      help="bookies to start when no --metadata is given")(fn)
    fn = click.option("--metadata", default=None,
                      help="metadata store URI of the cluster to measure; without it a local cluster is started")(fn)
    return fn


def _output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
                      help="write throughput and latency charts to this PNG file")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="machine-readable output")(fn)
    return fn


def _on_cluster(metadata: str | None, bookies: int, storage: str, quiet: bool,
                work: Callable[[str], Coroutine[Any, Any, T]]) -> tuple[T, str]:
    """Run ``work(metadata_uri)`` on the given cluster or on a temporary local one."""
    from ledgerstore.runtime import install_fast_loop, tune_gc

    install_fast_loop()
    tune_gc()
    if metadata:
        return run_async(work(metadata)), metadata
    from ledgerstore.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="ledgerstore-bench-") as tmp:
        cluster = LocalCluster(Path(tmp), bookies=bookies, port_base=None, storage=storage)
        if not quiet:
            err_console.print(f"starting {bookies} local bookies ({storage}) in {tmp}")
        try:
            cluster.start()
            return run_async(work(cluster.metadata)), f"local cluster of {bookies} bookies ({storage})"
        finally:
            cluster.stop()


def _progress(quiet: bool, description: str, total: float, by_time: bool) -> tuple[Progress, Callable[[float, int], None]]:
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[done]:>10,} entries"),
                        TimeElapsedColumn(), console=err_console, transient=True, disable=quiet)
    task = progress.add_task(description, total=total, done=0)

    def tick(elapsed: float, done: int) -> None:
        progress.update(task, completed=min(total, elapsed if by_time else done), done=done)

    return progress, tick


@click.group()
def bench() -> None:
    """Throughput and latency benchmarks (BookKeeper's BenchThroughputLatency)."""


@bench.command()
@_cluster_options
@click.option("-e", "--ensemble", default=3, show_default=True, type=click.IntRange(1))
@click.option("-w", "--write-quorum", default=2, show_default=True, type=click.IntRange(1))
@click.option("-a", "--ack-quorum", default=2, show_default=True, type=click.IntRange(1))
@click.option("--entry-size", default=1024, show_default=True, type=click.IntRange(1), help="bytes per entry")
@click.option("--ledgers", default=1, show_default=True, type=click.IntRange(1), help="ledgers written round-robin")
@click.option("--throttle", default=10_000, show_default=True, type=click.IntRange(1), help="most adds outstanding")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="seconds of measured writing (default 10 when --count is not given)")
@click.option("--count", type=click.IntRange(1), default=None, help="measured entries to write")
@click.option("--warmup", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="seconds of unmeasured writing first")
@click.option("--digest", default="crc32c", show_default=True)
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1),
              help="entries per call: 1 = append_async per entry, N = append_many_async of N entries")
@click.option("--keep-ledgers", is_flag=True, help="leave the ledgers (closed) instead of deleting them")
@_output_options
@handle_errors
def writes(metadata: str | None, bookies: int, storage: str, ensemble: int, write_quorum: int, ack_quorum: int,
           entry_size: int, ledgers: int, throttle: int, duration: float | None, count: int | None, warmup: float,
           digest: str, batch: int, keep_ledgers: bool, as_json: bool, plot_path: str | None) -> None:
    """Pipelined adds: entries/s, MB/s and add latency percentiles."""
    from ledgerstore.bench import WriteOptions, run_writes
    from ledgerstore.errors import ConfigError

    if duration is None and count is None:
        duration = 10.0
    opts = WriteOptions(ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum, entry_size=entry_size,
                        ledgers=ledgers, throttle=throttle, duration=duration, count=count, warmup=warmup,
                        digest=digest, batch=batch, keep_ledgers=keep_ledgers)
    opts.validate()
    if metadata is None and bookies < ensemble:
        raise ConfigError(f"--bookies {bookies} is fewer than the ensemble size {ensemble}")

    by_time = count is None
    progress, tick = _progress(as_json, "writing", (duration or 0) + warmup if by_time else count or 0, by_time)

    async def work(uri: str) -> Any:
        async with cluster_client(metadata=uri) as client:
            with progress:
                return await run_writes(client, opts, tick)

    result, where = _on_cluster(metadata, bookies, storage, as_json, work)
    data = result.to_dict()
    data["cluster"] = where
    title = (f"ledgerstore bench writes: E={ensemble} Qw={write_quorum} Qa={ack_quorum}, {entry_size} B, "
             f"{ledgers} ledger(s), throttle {throttle}")
    if plot_path:
        from ledgerstore.bench.plot import plot_result

        data["plot"] = str(plot_result(result, plot_path, title))
    _report(data, as_json, "latency_ms", "add latency ms")
    if not as_json:
        lat = result.latency_ms
        click.echo(f"bench writes: {result.entries:,} entries in {result.seconds:.2f} s: "
                   f"{result.entries_per_s:,.0f} entries/s, {result.mb_per_s:.2f} MB/s; add latency ms "
                   f"p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} p99.9 {lat['p99.9']:.2f} "
                   f"(E={ensemble} Qw={write_quorum} Qa={ack_quorum}, {entry_size} B, {where})")
    if result.errors:
        err_console.print(f"[red]{result.errors} add(s) failed; first: {result.first_error}[/red]")
        raise SystemExit(EXIT_FAILED)


@bench.command()
@_cluster_options
@click.option("--ledger-id", type=int, default=None, help="read this ledger instead of writing one first")
@click.option("--password", default=None, help="password of --ledger-id (UTF-8)")
@click.option("--count", default=10_000, show_default=True, type=click.IntRange(1),
              help="entries to write first when no --ledger-id is given")
@click.option("--entry-size", default=1024, show_default=True, type=click.IntRange(1))
@click.option("-e", "--ensemble", default=3, show_default=True, type=click.IntRange(1))
@click.option("-w", "--write-quorum", default=2, show_default=True, type=click.IntRange(1))
@click.option("-a", "--ack-quorum", default=2, show_default=True, type=click.IntRange(1))
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1), help="entries per read batch")
@click.option("--window", default=2, show_default=True, type=click.IntRange(1),
              help="batches read at once (the next ones travel while one is counted)")
@click.option("--keep-ledgers", is_flag=True, help="keep the ledger written for the run")
@_output_options
@handle_errors
def reads(metadata: str | None, bookies: int, storage: str, ledger_id: int | None, password: str | None, count: int,
          entry_size: int, ensemble: int, write_quorum: int, ack_quorum: int, batch: int, window: int,
          keep_ledgers: bool, as_json: bool, plot_path: str | None) -> None:
    """Sequential reads of a closed ledger: entries/s, MB/s, batch latency."""
    from ledgerstore.bench import ReadOptions, run_reads
    from ledgerstore.errors import ConfigError

    if ledger_id is not None and metadata is None:
        raise ConfigError("--ledger-id needs --metadata: a freshly started local cluster holds no ledgers")
    opts = ReadOptions(ledger_id=ledger_id, count=count, entry_size=entry_size, ensemble=ensemble,
                       write_quorum=write_quorum, ack_quorum=ack_quorum, batch=batch, window=window,
                       keep_ledgers=keep_ledgers)
    if password is not None:
        opts.password = password.encode()
    elif ledger_id is not None:
        opts.password = b""
    opts.validate()
    if metadata is None and bookies < ensemble:
        raise ConfigError(f"--bookies {bookies} is fewer than the ensemble size {ensemble}")

    async def work(uri: str) -> Any:
        async with cluster_client(metadata=uri) as client:
            if ledger_id is not None:
                total = (await client.ledger_metadata(ledger_id)).last_entry_id + 1
            else:
                total = count
            progress, tick = _progress(as_json, "reading", max(total, 1), False)
            with progress:
                return await run_reads(client, opts, tick)

    result, where = _on_cluster(metadata, bookies, storage, as_json, work)
    data = result.to_dict()
    data["cluster"] = where
    if plot_path:
        from ledgerstore.bench.plot import plot_result

        data["plot"] = str(plot_result(result, plot_path, f"ledgerstore bench reads: ledger {result.ledger_id}, "
                                                          f"batches of {batch}"))
    _report(data, as_json, "batch_latency_ms", "batch latency ms")
    if not as_json:
        lat = result.batch_latency_ms
        click.echo(f"bench reads: {result.entries:,} entries of ledger {result.ledger_id} in {result.seconds:.2f} s: "
                   f"{result.entries_per_s:,.0f} entries/s, {result.mb_per_s:.2f} MB/s; batch latency ms "
                   f"p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} ({where})")


def _report(data: dict[str, Any], as_json: bool, latency_key: str, latency_title: str) -> None:
    if as_json:
        emit(data, True)
        return
    shown = {k: v for k, v in data.items() if k not in ("per_second", "options", latency_key)}
    for name, value in data[latency_key].items():
        shown[f"{latency_title} {name}"] = f"{value:.3f}"
    emit(shown, False, title=f"ledgerstore bench {data['mode']}")
