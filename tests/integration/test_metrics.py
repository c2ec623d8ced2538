"""A bookie's /metrics, scraped from a real bookie process with the admin token, carries latency
histograms under ledgerstore's names and BookKeeper's; they count the requests made; and every
metric the shipped Grafana dashboard queries exists in what a bookie and a client expose."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledgerstore.aio import Client
from ledgerstore.client.metrics import CLIENT_METRICS
from ledgerstore.cluster import LocalCluster, free_ports

from .admin_http_cluster import listening

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "ledgerstore-dashboard.json"
TOKEN = "metrics-scrape-token-5f1c"
ADDS = 7
READS = 4

#: words of PromQL that are not metric names
_PROMQL_WORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                           "and", "or", "unless", "inf", "nan"})
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, aggregations,
    keywords, label names in matchers or grouping clauses, or range durations."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, regexes)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery durations
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\b\d[0-9a-zA-Z_.]*", "", expr)  # numbers and durations (0.99, 1e3, offset 5m)
    names = set()
    for m in _NAME.finditer(expr):
        word = m.group(0)
        rest = expr[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in _PROMQL_WORDS:
            continue  # a function or aggregation, or a keyword
        names.add(word)
    return names


def dashboard_metric_names(dashboard: dict) -> dict[str, set[str]]:
    """Every metric each panel (and each templating query) of a dashboard asks for, by panel title."""
    out: dict[str, set[str]] = {}

    def walk(panels: list[dict]) -> Iterator[dict]:
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    for p in walk(dashboard["panels"]):
        for t in p.get("targets", []):
            out.setdefault(p["title"], set()).update(promql_metric_names(t["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        query = query.get("query", "") if isinstance(query, dict) else ""
        m = re.match(r"\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,", query)
        if m:
            out.setdefault(f"variable {var['name']}", set()).add(m.group(1))
    return out


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(port: int, token: str | None = TOKEN) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def poll(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_promql_names_are_extracted_from_expressions() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, instance) (rate(a_bucket{instance=~"$x", le!="+Inf"}'
            '[$__rate_interval]))) / ignoring(job) b_total offset 5m + on(instance) group_left c')
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_latency_histograms_count_requests_and_the_dashboard_queries_only_exposed_metrics(
        cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> None:
    (port,) = free_ports(1)
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    cluster = cluster_factory(1, extra_bookie_config=(
        f"http_port = {port}\nflush_interval_ms = 200\n"
        "[bookie.autorecovery]\nenabled = true\n"
        f'[bookie.http]\ntoken_file = "{token_file}"\nallow_anonymous_read = false\n'))
    cluster.start()
    poll("the admin port", lambda: listening(port))

    # with anonymous reads off, Prometheus scrapes with the token (docs/admin-http.md)
    assert scrape(port, token=None)[0] == 401
    status, text = scrape(port)
    assert status == 200, text
    before = samples(text)
    client_before = samples(CLIENT_METRICS.render().decode())

    async def work() -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            for i in range(ADDS):  # one at a time: each is one add request at the bookie
                await lh.append(b"entry %d" % i)
            for i in range(READS):  # each a one-entry batch read: one READ_MULTI request
                assert (await lh.read(i, i))[0].payload == b"entry %d" % i
            await lh.close()

    asyncio.run(work())

    def moved(after: dict, name: str, base: dict | None = None, **labels: str) -> float:
        return value(after, name, **labels) - value(before if base is None else base, name, **labels)

    # the add histogram counts an add once its answer went out, just after the send: poll for it
    poll("the add requests to be counted",
         lambda: moved(samples(scrape(port)[1]), "ledgerstore_bookie_add_request_seconds_count") >= ADDS)
    after = samples(scrape(port)[1])
    assert moved(after, "ledgerstore_bookie_add_request_seconds_count") == ADDS
    assert moved(after, "bookkeeper_server_ADD_ENTRY_REQUEST_count", success="true") == ADDS
    assert moved(after, "ledgerstore_bookie_add_request_seconds_bucket", le="+Inf") == ADDS
    assert moved(after, "ledgerstore_bookie_add_request_seconds_sum") > 0
    assert moved(after, "ledgerstore_bookie_read_request_seconds_count") == READS
    assert moved(after, "bookkeeper_server_READ_ENTRY_REQUEST_count", success="true") == READS
    # the journal counts every append (the ledger's master key record too) and every group's fsync
    assert moved(after, "ledgerstore_journal_add_seconds_count") >= ADDS
    assert moved(after, "bookie_journal_JOURNAL_ADD_ENTRY_count", success="true") >= ADDS
    assert moved(after, "ledgerstore_journal_queue_seconds_count") >= ADDS
    assert moved(after, "ledgerstore_journal_sync_seconds_count") >= 1
    assert (value(after, "ledgerstore_journal_sync_seconds_count")
            == value(after, "ledgerstore_journal_fsync_seconds_count"))
    # BookKeeper's quantiles are milliseconds over the last minute, and the adds fall in it
    p99 = value(after, "bookkeeper_server_ADD_ENTRY_REQUEST", success="true", quantile="0.99")
    assert 0 < p99 <= 10_000
    client_after = samples(CLIENT_METRICS.render().decode())
    assert moved(client_after, "ledgerstore_client_add_seconds_count", client_before) == ADDS
    assert moved(client_after, "bookkeeper_client_ADD_ENTRY_count", client_before, success="true") == ADDS
    assert moved(client_after, "ledgerstore_client_read_seconds_count", client_before) == READS

    # checkpoints (every 200 ms), the loop-lag probe and the elected auditor show up on their own
    def background_figures() -> bool:
        s = samples(scrape(port)[1])
        return (value(s, "ledgerstore_storage_flush_seconds_count") >= 1
                and value(s, "ledgerstore_bookie_event_loop_lag_seconds_count") >= 1
                and value(s, "ledgerstore_auditor_elected") == 1)
    poll("checkpoints, loop-lag samples and the auditor", background_figures)
    last = samples(scrape(port)[1])
    assert value(last, "ledgerstore_auditor_under_replicated_ledgers") == 0
    assert value(last, "auditor_NUM_UNDER_REPLICATED_LEDGERS") == 0
    assert value(last, "ledgerstore_auditor_lost_bookies") == 0

    exposed = {name for name, _ in last} | {name for name, _ in client_after}
    wanted = dashboard_metric_names(json.loads(DASHBOARD.read_text()))
    assert sum(len(names) for names in wanted.values()) >= 20
    missing = {title: sorted(names - exposed) for title, names in wanted.items() if names - exposed}
    assert not missing, f"dashboard panels query metrics no bookie or client exposes: {missing}"


def test_auto_recovery_and_ensemble_change_figures_move_when_a_bookie_is_lost(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(4)
    ports = free_ports(4)
    cluster.data_dir.mkdir(parents=True, exist_ok=True)
    cluster.write_configs()
    for i, port in enumerate(ports):  # each bookie its own admin port; anonymous scrapes (the default)
        with open(cluster.config_path(i), "a") as fh:
            fh.write(f"http_port = {port}\n[bookie.metadata_options]\nsession_timeout = 4\n"
                     "[bookie.autorecovery]\nenabled = true\nlost_bookie_recovery_delay_s = 1.0\n"
                     "open_ledger_rereplication_grace_s = 3.0\nlease_s = 4.0\n")
    cluster.start()
    for port in ports:
        poll("the admin port", lambda port=port: listening(port))

    def scrapes(which: list[int]) -> list[dict]:
        out = []
        for i in which:
            status, text = scrape(ports[i], token=None)
            assert status == 200, text
            out.append(samples(text))
        return out

    auditors: list[int] = []

    def one_auditor() -> bool:
        auditors[:] = [i for i, s in enumerate(scrapes([0, 1, 2, 3])) if value(s, "ledgerstore_auditor_elected") == 1]
        return len(auditors) == 1
    poll("an auditor to be elected", one_auditor)
    victim = next(i for i in range(4) if i != auditors[0])
    ensemble = [cluster.bookie_id(i) for i in range(4) if i != auditors[0]]  # the victim included
    changes_before = CLIENT_METRICS.ensemble_changes

    async def write_then_lose_a_bookie() -> None:
        async with Client(metadata=cluster.metadata) as client:
            closed = await client.create_ledger(3, 3, 2, password=b"pw", bookies=ensemble)
            await closed.append_many([b"c%d" % i for i in range(20)])
            await closed.close()
            open_ = await client.create_ledger(3, 3, 2, password=b"pw", bookies=ensemble)
            await open_.append_many([b"o%d" % i for i in range(5)])
            cluster.kill(victim)
            for i in range(5):  # the writer replaces the dead bookie by an ensemble change
                await open_.append(b"after %d" % i)
            await open_.close()

    asyncio.run(asyncio.wait_for(write_then_lose_a_bookie(), 120))
    assert CLIENT_METRICS.ensemble_changes - changes_before >= 1
    client_now = samples(CLIENT_METRICS.render().decode())
    assert value(client_now, "bookkeeper_client_NUM_ENSEMBLE_CHANGE") == CLIENT_METRICS.ensemble_changes
    assert value(client_now, "ledgerstore_client_ensemble_changes_total") == CLIENT_METRICS.ensemble_changes

    live = [i for i in range(4) if i != victim]

    def recovered() -> bool:
        now = scrapes(live)
        auditor = max(now, key=lambda s: value(s, "ledgerstore_auditor_elected"))
        copied = sum(value(s, "ledgerstore_replication_entries_total") for s in now)
        return (value(auditor, "ledgerstore_auditor_lost_bookies") == 1
                and value(auditor, "ledgerstore_auditor_ledgers_marked_total") >= 1
                and copied >= 20
                and value(auditor, "ledgerstore_auditor_under_replicated_ledgers") == 0)
    poll("the lost bookie's ledgers to be re-replicated", recovered, timeout=90)
    now = scrapes(live)
    assert (sum(value(s, "replication_worker_NUM_ENTRIES_WRITTEN") for s in now)
            == sum(value(s, "ledgerstore_replication_entries_total") for s in now))
    assert sum(value(s, "replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED") for s in now) >= 1


REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "bookkeeper_metrics.json"
ADMIN_DOC = Path(__file__).resolve().parents[2] / "docs" / "admin-http.md"


def exposed_names(text: str) -> set[str]:
    """Every sample name of an exposition, as written (BookKeeper's counters carry no ``_total``)."""
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


@pytest.mark.parametrize("storage", ["entrylog", "rocksdb"])
def test_every_bookkeeper_metric_of_the_reference_list_is_scraped_from_a_live_bookie(
        cluster_factory: Callable[..., LocalCluster], tmp_path: Path, storage: str) -> None:
    reference = json.loads(REFERENCE.read_text())
    (port,) = free_ports(1)
    cluster = cluster_factory(1, storage=storage, extra_bookie_config=(
        f"http_port = {port}\n[bookie.autorecovery]\nenabled = true\n"))
    cluster.start()
    poll("the admin port", lambda: listening(port))

    async def work() -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            await lh.append_many([b"entry %d" % i for i in range(ADDS)])
            open_one = await client.create_ledger(1, 1, 1, password=b"pw")
            await open_one.append(b"left open")
            # opening a ledger its writer left open recovers it: LEDGER_OPEN and LEDGER_RECOVER
            assert (await (await client.open_ledger(open_one.ledger_id, b"pw")).read(0, 0))[0].payload == b"left open"
            assert len(await lh.read(0, ADDS - 1)) == ADDS
            await lh.close()
            await client.delete_ledger(open_one.ledger_id)

    asyncio.run(work())
    poll("the elected auditor", lambda: value(samples(scrape(port, None)[1]), "ledgerstore_auditor_elected") == 1)
    status, text = scrape(port, None)
    assert status == 200
    bookie = exposed_names(text)
    client = exposed_names(CLIENT_METRICS.render().decode())
    wanted = [m for m in reference["metrics"] if storage in m.get("engines", [storage])]
    missing = sorted(m["name"] for m in wanted if m["name"] not in (client if m.get("client") else bookie))
    assert not missing, f"BookKeeper's names not exported ({storage}): {missing}"
    # no constant stand-ins: what has no meaning here is not exported, and the docs say why
    doc = ADMIN_DOC.read_text()
    for m in reference["absent"]:
        assert m["name"] not in bookie | client, m
        assert m["name"] in doc, f"docs/admin-http.md does not say why {m['name']} is absent"

    # the figures are the bookie's own: they moved with the work done
    after = samples(text)
    assert value(after, "bookie_READ_BYTES") >= sum(len(b"entry %d" % i) for i in range(ADDS))
    assert value(after, "bookie_journal_JOURNAL_WRITE_BYTES") > value(after, "bookie_WRITE_BYTES") > 0
    assert value(after, "bookie_ledger_num_dirs") == value(after, "bookie_ledger_writable_dirs") == 1
    assert value(after, "bookie_journal_JOURNAL_FORCE_WRITE_GROUPING_COUNT_count", success="true") >= 1
    assert value(after, "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES_sum", success="true") >= ADDS
    flushes = sum(value(after, f"bookie_journal_JOURNAL_NUM_FLUSH_{r}")
                  for r in ("EMPTY_QUEUE", "MAX_WAIT", "MAX_OUTSTANDING_BYTES"))
    assert flushes == value(after, "ledgerstore_journal_groups_total")
    assert value(after, "bookie_journal_JOURNAL_CREATION_LATENCY_count", success="true") >= 1
    if storage == "rocksdb":
        assert value(after, "bookie_entries_count") >= ADDS
    else:
        assert value(after, "bookie_ACTIVE_ENTRY_LOG_TOTAL") >= 1
    for op in ("CREATE", "OPEN", "RECOVER", "DELETE"):
        assert value(samples(CLIENT_METRICS.render().decode()), f"bookkeeper_client_LEDGER_{op}_count",
                     success="true") >= 1, op
