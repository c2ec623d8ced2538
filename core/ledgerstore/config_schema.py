"""The typed configuration of bookies and clients: the dataclasses, their defaults, and the
checks each makes of its own values. :mod:`ledgerstore.config` loads them from TOML and the
environment and checks the plugins they name; hook specifications use these types without
depending on that loading."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ledgerstore.api.options import MAX_DURATION_S

#: bounds of ``max_frame_size``: a frame must hold any request's header and a small entry, and
#: its length must fit the 4-byte length prefix with room to spare
MIN_FRAME_SIZE = 4096
MAX_FRAME_SIZE = 1 << 30
#: most entries one re-replication batch reads and writes (the wire's limit of an ADD_BATCH)
MAX_REREPLICATION_BATCH = 65536


@dataclasses.dataclass
class JournalConfig:
    """The bookie's write-ahead journal."""

    #: wait at most this long for more records before committing a group (BookKeeper: journalMaxGroupWaitMSec)
    max_group_wait_ms: float = 2.0
    #: commit a group once it holds this many bytes (journalBufferedWritesThreshold)
    max_group_bytes: int = 512 * 1024
    #: commit at once when no more records are queued, instead of waiting max_group_wait_ms
    flush_when_queue_empty: bool = True
    #: roll to a new journal file past this size (journalMaxSizeMB)
    max_file_size_mb: int = 2048
    #: journal files wholly before the checkpoint mark to keep (journalMaxBackups)
    max_backups: int = 5
    #: fsync before acknowledging; turning it off loses acknowledged entries on power failure
    sync: bool = True
    #: write the journal with O_DIRECT (whole 4 KiB blocks, not through the page cache) where the
    #: file system supports it; where it is refused (EINVAL), the journal writes through the page cache
    direct_io: bool = True


@dataclasses.dataclass
class AutoRecoveryConfig:
    """Auto-recovery (``[bookie.autorecovery]``): the auditor candidate and replication workers a
    bookie runs beside itself, or ``ledgerstore autorecovery`` runs on its own."""

    #: run an auditor candidate and replication workers in this bookie (autoRecoveryDaemonEnabled)
    enabled: bool = False
    #: how long a bookie must be gone before its ledgers are marked under-replicated
    #: (lostBookieRecoveryDelay; the shell's lostbookierecoverydelay overrides it cluster-wide)
    lost_bookie_recovery_delay_s: float = 0.0
    #: full check of every ledger's metadata, catching whatever events were missed (auditorPeriodicCheckInterval)
    audit_interval_s: float = 3600.0
    #: entries copied per second by each worker (omit it, or inf, for no throttle); with
    #: replication_rate_by_bytes it keeps re-replication from taking the disk and network the
    #: writers need
    rereplication_entries_per_s: float = math.inf
    #: bytes copied per second by each worker (BookKeeper: replicationRateByBytes; omit it, or inf,
    #: for no throttle)
    replication_rate_by_bytes: float = math.inf
    #: entries read from a surviving bookie in one request and written to the replacement in one
    #: recovery add batch (rereplicationEntryBatchSize)
    rereplication_entry_batch_size: int = 100
    #: how long an open ledger's writer may keep its last fragment before a worker fences and
    #: closes the ledger to re-replicate it (openLedgerRereplicationGracePeriod)
    open_ledger_rereplication_grace_s: float = 30.0
    #: a worker's claim on a marker lapses this long after its last renewal (a killed worker's
    #: work is taken over after at most this)
    lease_s: float = 30.0
    #: ledgers each worker re-replicates at once
    parallel_ledgers: int = 4
    #: seconds between replicas checks, which ask every bookie which ledgers it really holds and
    #: mark what it lacks (auditorReplicasCheckInterval); 0 = only on request (a bookie that finds
    #: its data gone asks for one)
    replicas_check_interval_s: float = 86400.0
    #: the replicas check leaves the shortfalls of a bookie whose registration says it has
    #: ledgers in limbo to the bookie's own repair while its limbo count keeps falling, and checks
    #: it like any other once the count has not fallen for this many seconds (a repair that is
    #: stuck must not hide a loss for ever); 0 = never leave them to it
    limbo_patience_s: float = 3600.0
    #: client-side transport options for the copies (TLS CA, CURVE keys, ...)
    client_transport: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: placement policy that chooses replacement bookies (BookKeeper's ensemblePlacementPolicy of
    #: the auto-recovery process): set it as the writers' is set, or a lost rack's ledgers may be
    #: re-replicated onto one rack
    placement: str = "random"
    #: options of that placement policy (e.g. min_racks_per_write_quorum, topology_file)
    placement_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def validate(self) -> list[str]:
        problems = []
        if self.lost_bookie_recovery_delay_s < 0:
            problems.append("'autorecovery.lost_bookie_recovery_delay_s' must be >= 0")
        if self.audit_interval_s <= 0:
            problems.append("'autorecovery.audit_interval_s' must be positive")
        for name in ("rereplication_entries_per_s", "replication_rate_by_bytes"):
            rate = getattr(self, name)
            if not rate > 0:  # NaN too
                problems.append(f"'autorecovery.{name}' = {rate} must be a positive rate (omit it for no throttle)")
        if not 1 <= self.rereplication_entry_batch_size <= MAX_REREPLICATION_BATCH:
            problems.append(f"'autorecovery.rereplication_entry_batch_size' = {self.rereplication_entry_batch_size} "
                            f"must be between 1 and {MAX_REREPLICATION_BATCH}")
        if self.open_ledger_rereplication_grace_s < 0:
            problems.append("'autorecovery.open_ledger_rereplication_grace_s' must be >= 0")
        if self.lease_s < 1:
            problems.append("'autorecovery.lease_s' must be at least 1 second")
        if self.parallel_ledgers < 1:
            problems.append("'autorecovery.parallel_ledgers' must be at least 1")
        if self.replicas_check_interval_s < 0:
            problems.append("'autorecovery.replicas_check_interval_s' must be >= 0 (0 = only on demand)")
        if not self.limbo_patience_s >= 0:  # NaN too
            problems.append("'autorecovery.limbo_patience_s' must be >= 0 (0 = check bookies in limbo like any other)")
        return problems


@dataclasses.dataclass
class AdminHttpConfig:
    """Who may use the admin HTTP server (``[bookie.http]``; its port is ``http_port``).

    State-changing endpoints (PUT, POST, DELETE) always need credentials: a bearer token
    (``Authorization: Bearer <token>``, the token read once at start from ``token_file``), a user
    and password of ``credentials_file`` (HTTP Basic), or a client certificate signed by
    ``tls_ca_file``. With none configured they answer 403."""

    #: file holding the admin bearer token (one line; keep it mode 0600); read once at start
    token_file: str = ""
    #: credential file of users who may authenticate with HTTP Basic (``ledgerstore credentials
    #: add NAME --file F`` writes it; mode 0600); the Kafka listener's SASL can read the same file
    credentials_file: str = ""
    #: let GET endpoints (metrics, state, listings) answer without credentials, as BookKeeper's
    #: admin server does and as a Prometheus scrape without credentials needs; state changes
    #: never do. Set false to require the token or a client certificate for reads too
    allow_anonymous_read: bool = True
    #: let the ledger endpoints (/api/v1/ledger/list, metadata and read) answer GETs without
    #: credentials too. Off by default: ledger data and metadata belong to the applications, so
    #: reading them needs the token or a client certificate even when allow_anonymous_read is
    #: on (ledger/read also needs the ledger's password)
    allow_anonymous_ledger_read: bool = False
    #: GET paths that answer without credentials even when allow_anonymous_read is false
    #: (liveness and readiness probes; they tell nothing a TCP connect does not)
    anonymous_paths: list[str] = dataclasses.field(default_factory=lambda: ["/heartbeat", "/api/v1/bookie/is_ready"])
    #: serve HTTPS with this certificate (PEM); needs tls_key_file
    tls_cert_file: str = ""
    #: private key of tls_cert_file (PEM)
    tls_key_file: str = ""
    #: CA (PEM) whose client certificates authenticate like the token (mutual TLS); needs tls_cert_file
    tls_ca_file: str = ""

    def validate(self) -> list[str]:
        problems = []
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            problems.append("'http.tls_cert_file' and 'http.tls_key_file' go together: set both or neither")
        if self.tls_ca_file and not self.tls_cert_file:
            problems.append("'http.tls_ca_file' (client certificates) needs 'http.tls_cert_file' and 'http.tls_key_file'")
        for path in self.anonymous_paths:
            if not path.startswith("/"):
                problems.append(f"'http.anonymous_paths' entry {path!r} must be a path starting with '/'")
        return problems


@dataclasses.dataclass
class BookieConfig:
    """A bookie process. ``metadata`` is required; everything else has a default."""

    #: metadata store URI: sqlite:///path.db, zk://host:2181/ledgers or etcd://host:2379/ledgers (required)
    metadata: str = ""
    #: the address to listen on: tcp://host:port, tcp+tls://host:port or zmq://host:port
    listen: str = "tcp://127.0.0.1:3181"
    #: the address clients use (defaults to ``listen``); its host:port is the bookie id
    advertised_address: str = ""
    #: directory of the write-ahead journal (its own disk if possible: every ack waits for its fsync)
    journal_dir: str = "data/bookie/journal"
    #: directories of the storage engine (entrylog spreads ledgers over them)
    ledger_dirs: list[str] = dataclasses.field(default_factory=lambda: ["data/bookie/ledgers"])
    #: storage engine plugin: entrylog (default) or rocksdb
    storage: str = "entrylog"
    #: checkpoint interval: flush the storage engine and advance the journal mark (flushInterval)
    flush_interval_ms: int = 60_000
    #: the periodic checkpoint (flush_interval_ms) and garbage collection (gc_wait_time_ms) each
    #: wait their interval times a random factor within this fraction of 1, and the first time
    #: after start-up from half to one and a half of it: bookies started together (a deploy) do
    #: not flush or compact in the same seconds, which a write quorum would wait for (0: exactly
    #: the interval, from start-up)
    background_timer_jitter: float = 0.1
    #: largest wire frame accepted, in bytes (4 KiB to 1 GiB); larger ones are refused before
    #: allocation. It also bounds what one connection buffers of an unfinished frame
    max_frame_size: int = 5 * 1024 * 1024
    #: bytes of unfinished frames buffered across all connections (at least max_frame_size); past
    #: it the connection stalled longest on its unfinished frame is closed
    max_unfinished_frame_bytes: int = 256 * 1024 * 1024
    #: a connection whose unfinished frame is older than this many seconds is closed
    unfinished_frame_timeout_s: float = 30.0
    #: client connections open at once; one accepted past it is closed at once (one log line per
    #: thousand refused, with the count; refused_connections in the transport metrics)
    max_connections: int = 10_000
    #: a connection that sends and receives nothing for this many seconds is closed (clients
    #: reconnect on their next request)
    idle_connection_timeout_s: float = 600.0
    #: adds one connection may have waiting for the journal; more are answered TOO_MANY_REQUESTS
    #: (clients back off and resend), so one writer cannot make the bookie queue without bound
    max_adds_in_flight_per_connection: int = 200_000
    #: long-poll LAC requests waiting on this bookie at once; more are answered TOO_MANY_REQUESTS
    max_long_poll_waiters: int = 50_000
    #: long-poll LAC requests one connection may have waiting; more are answered TOO_MANY_REQUESTS
    max_long_poll_waiters_per_connection: int = 5_000
    #: adds and fences of ledgers new to this bookie waiting for the metadata look-up that allows
    #: their first master key; more are answered TOO_MANY_REQUESTS
    max_requests_awaiting_metadata: int = 10_000
    #: threads that read entries from the storage engine (BookKeeper: numReadWorkerThreads): a read
    #: of entries not in the page cache waits for the disk there, never on the event loop that
    #: serves adds; 0 reads on the event loop (BookKeeper's 0: on the network thread)
    num_read_worker_threads: int = 2
    #: reads waiting for a read worker, per thread (maxPendingReadRequestsPerThread); more are
    #: answered TOO_MANY_REQUESTS (clients back off and ask again)
    max_pending_read_requests_per_thread: int = 10_000
    #: placement facts published in the registration
    rack: str = "/default-rack"
    #: region published in the registration (region-aware placement)
    region: str = "default-region"
    #: create the cluster's instance id when the metadata store has none; off by default, as in
    #: BookKeeper: a cluster is created by `shell initnewcluster` (or the standalone), so a bookie
    #: pointed at a mistyped metadata URI fails instead of founding a cluster of its own
    auto_init_cluster: bool = False
    #: at start, a bookie whose directories lost what its cookie says it held (wiped, replaced or
    #: restored from an old copy under the same identity) puts every ledger the metadata store says
    #: it may hold in limbo before it serves, and repairs them from their other replicas
    #: (BookKeeper's dataIntegrityCheckingEnabled); off, it serves its empty disks as before
    data_integrity_checking_enabled: bool = True
    #: at start, retry a metadata store that fails (restarting, sqlite's "database is locked")
    #: with backoff for this many seconds before giving up; 0 = fail at the first error. With
    #: sqlite it must outlast its busy_timeout (30 s by default), or a locked file gets one try
    metadata_start_retry_s: float = 90.0
    #: turn read-only past this fraction of disk used, writable again below the low-water mark
    disk_usage_threshold: float = 0.95
    #: writable again once disk usage falls below this fraction
    disk_usage_lwm: float = 0.90
    #: how often the disk checker looks at usage (at once, too, when a write finds a disk full)
    disk_check_interval_ms: int = 10_000
    #: admin HTTP port; 0 disables it (the BookKeeper default)
    http_port: int = 0
    #: address the admin HTTP server binds to
    http_address: str = "127.0.0.1"
    #: the [bookie.http] table: admin HTTP credentials (token, mutual TLS, anonymous reads)
    http: AdminHttpConfig = dataclasses.field(default_factory=AdminHttpConfig)
    #: the [bookie.journal] table
    journal: JournalConfig = dataclasses.field(default_factory=JournalConfig)
    #: the [bookie.autorecovery] table
    autorecovery: AutoRecoveryConfig = dataclasses.field(default_factory=AutoRecoveryConfig)
    #: options for the transport plugin (TLS files, CURVE keys, ...)
    transport: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: options for the storage engine plugin
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: options for the metadata store plugin (session timeouts, credentials, ...)
    metadata_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: milliseconds between garbage collections of deleted ledgers (<= 0 disables; gcWaitTime)
    gc_wait_time_ms: int = 900_000
    #: minor compaction rewrites entry logs with less than this live fraction (<= 0 disables)
    minor_compaction_threshold: float = 0.2
    #: seconds between minor compactions
    minor_compaction_interval_s: int = 3600
    #: major compaction rewrites entry logs with less than this live fraction (<= 0 disables)
    major_compaction_threshold: float = 0.8
    #: seconds between major compactions
    major_compaction_interval_s: int = 86400

    def validate(self) -> list[str]:
        problems = []
        if not self.metadata:
            problems.append("'metadata' is required, e.g. metadata = \"sqlite:///var/lib/ledgerstore/meta.db\"")
        elif "://" not in self.metadata:
            problems.append(f"'metadata' = {self.metadata!r} is not a URI (scheme://...)")
        problems.extend(address_problems("listen", self.listen, allow_any_port=True))
        if self.advertised_address:
            problems.extend(address_problems("advertised_address", self.advertised_address))
        advertised = self.advertised_address or self.listen
        if advertised.partition("://")[2].rpartition(":")[0].strip("[]") in WILDCARD_HOSTS:
            which = ("'advertised_address'" if self.advertised_address
                     else "'listen' (advertised when 'advertised_address' is unset)")
            problems.append(
                f"{which} = {advertised!r} names every interface, which clients cannot connect to: set "
                "'advertised_address' to the address or hostname clients reach this bookie by, "
                "e.g. tcp://bookie1.example.com:3181"
            )
        if self.http_port and not 1 <= self.http_port <= MAX_PORT:
            problems.append(f"'http_port' = {self.http_port} must be between 1 and {MAX_PORT} (0 disables it)")
        for name in ("disk_check_interval_ms", "minor_compaction_interval_s", "major_compaction_interval_s",
                     "journal.max_file_size_mb"):
            obj, _, attr = name.rpartition(".")
            if getattr(self.journal if obj else self, attr) <= 0:
                problems.append(f"'{name}' must be positive")
        if self.journal.max_group_wait_ms < 0:
            problems.append("'journal.max_group_wait_ms' must be >= 0")
        if self.journal.max_backups < 0:
            problems.append("'journal.max_backups' must be >= 0")
        if self.metadata_start_retry_s < 0:
            problems.append("'metadata_start_retry_s' must be >= 0 (0 = no retry)")
        elif self.metadata.startswith("sqlite://") and self.metadata_start_retry_s:
            busy = self.metadata_options.get("busy_timeout", 30.0)
            if isinstance(busy, int | float) and self.metadata_start_retry_s <= busy:
                problems.append(f"'metadata_start_retry_s' = {self.metadata_start_retry_s} must be longer than the "
                                f"sqlite busy_timeout ({busy}), or a locked database gets a single try")
        if not self.ledger_dirs:
            problems.append("'ledger_dirs' must name at least one directory")
        if not 0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1:
            problems.append("need 0 < disk_usage_lwm <= disk_usage_threshold <= 1")
        if self.journal.max_group_bytes <= 0:
            problems.append("'journal.max_group_bytes' must be positive")
        if self.flush_interval_ms <= 0:
            problems.append("'flush_interval_ms' must be positive")
        if not MIN_FRAME_SIZE <= self.max_frame_size <= MAX_FRAME_SIZE:
            problems.append(f"'max_frame_size' = {self.max_frame_size} must be between {MIN_FRAME_SIZE} and "
                            f"{MAX_FRAME_SIZE} bytes (default {5 * 1024 * 1024})")
        elif self.max_unfinished_frame_bytes < self.max_frame_size:
            problems.append(f"'max_unfinished_frame_bytes' = {self.max_unfinished_frame_bytes} must be at least "
                            f"'max_frame_size' ({self.max_frame_size}), or no frame of the largest size could arrive")
        if self.unfinished_frame_timeout_s <= 0:
            problems.append("'unfinished_frame_timeout_s' must be positive")
        if self.max_connections < 1:
            problems.append("'max_connections' must be at least 1")
        if self.idle_connection_timeout_s <= 0:
            problems.append("'idle_connection_timeout_s' must be positive")
        if not 0.0 <= self.background_timer_jitter < 1.0:
            problems.append(f"'background_timer_jitter' = {self.background_timer_jitter} must be at least 0 and "
                            "below 1 (a fraction of the interval)")
        if self.num_read_worker_threads < 0:
            problems.append(f"'num_read_worker_threads' = {self.num_read_worker_threads} must be >= 0 "
                            "(0 = read on the event loop)")
        for name in ("max_adds_in_flight_per_connection", "max_long_poll_waiters", "max_pending_read_requests_per_thread",
                     "max_long_poll_waiters_per_connection", "max_requests_awaiting_metadata"):
            if getattr(self, name) < 1:
                problems.append(f"'{name}' must be at least 1")
        problems.extend(self.autorecovery.validate())
        problems.extend(self.http.validate())
        problems.extend(duration_problems(self))
        return problems


@dataclasses.dataclass
class ClientConfig:
    """A client. ``metadata`` is required."""

    #: metadata store URI of the cluster (required)
    metadata: str = ""
    #: default ensemble size E of new ledgers
    ensemble: int = 3
    #: default write quorum Qw (E >= Qw)
    write_quorum: int = 2
    #: default ack quorum Qa (Qw >= Qa >= 1)
    ack_quorum: int = 2
    #: default digest: crc32c, crc32, hmac-sha256 or none
    digest: str = "crc32c"
    #: placement policy plugin: random, rack-aware, region-aware, disk-aware
    placement: str = "random"
    #: options of the placement policy (e.g. min_racks_per_write_quorum)
    placement_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: seconds before an add to one bookie counts as failed (addEntryTimeout)
    add_timeout_s: float = 10.0
    #: seconds before a read from one bookie counts as failed (readEntryTimeout)
    read_timeout_s: float = 5.0
    #: seconds a metadata read (ledger metadata, the bookie list) keeps retrying while the metadata
    #: store is unreachable before the client reports the outage
    metadata_read_retry_s: float = 30.0
    #: ask the next replica when the first has not answered within this (0 disables)
    speculative_read_timeout_ms: int = 2000
    #: adds outstanding before append blocks (throttle); 0 = unlimited
    max_outstanding_adds: int = 100_000
    #: replace a failed bookie by an ensemble change instead of failing the add
    ensemble_change: bool = True
    #: keep the ledger password in its metadata so auto-recovery can re-replicate and fence it
    #: (BookKeeper's storePasswordInMetadata)
    store_password_in_metadata: bool = True
    #: scrypt's cost N (a power of two, 1024 to 1048576) of the password check stored in new
    #: ledgers' metadata (8192: about 20 ms and 8 MiB per create or open). Each check names its
    #: own cost; a ledger whose check costs less is rewritten at its next open with the password
    password_check_cost: int = 8192
    #: largest wire frame, in bytes (match the bookies')
    max_frame_size: int = 5 * 1024 * 1024
    #: transport options, per scheme: { "tcp+tls" = { ca_file = ... }, zmq = { curve_server_public_key = ... } }
    transport: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: options of the metadata store plugin (session_timeout, credentials, ...)
    metadata_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: seconds between two bookie health checks (bookieHealthCheckIntervalSeconds; 0 disables the
    #: check). Each check quarantines the bookies with too many errors in the interval, unless
    #: ``shell healthcheck`` disabled it cluster-wide
    health_check_interval_s: float = 60.0
    #: errors (timeouts, lost connections, IO errors; not fencing or missing entries) of one bookie
    #: in one interval that quarantine it (bookieErrorThresholdPerInterval)
    bookie_error_threshold_per_interval: int = 100
    #: seconds a quarantined bookie is left out of new ensembles and replacements while enough
    #: other bookies exist (bookieQuarantineTimeSeconds)
    bookie_quarantine_time_s: float = 1800.0

    def validate(self) -> list[str]:
        problems = []
        if not self.metadata:
            problems.append("'metadata' is required, e.g. metadata = \"sqlite:///var/lib/ledgerstore/meta.db\"")
        if not self.ensemble >= self.write_quorum >= self.ack_quorum >= 1:
            problems.append(
                f"need ensemble >= write_quorum >= ack_quorum >= 1, got {self.ensemble}/{self.write_quorum}/{self.ack_quorum}"
            )
        from ledgerstore.proto.digest import DIGEST_TYPES, normalize_digest_type

        if normalize_digest_type(self.digest) not in DIGEST_TYPES:
            problems.append(f"'digest' = {self.digest!r}; choose one of {', '.join(DIGEST_TYPES)}")
        if not MIN_FRAME_SIZE <= self.max_frame_size <= MAX_FRAME_SIZE:
            problems.append(f"'max_frame_size' = {self.max_frame_size} must be between {MIN_FRAME_SIZE} and "
                            f"{MAX_FRAME_SIZE} bytes (default {5 * 1024 * 1024}; match the bookies')")
        if self.metadata and "://" not in self.metadata:
            problems.append(f"'metadata' = {self.metadata!r} is not a URI (scheme://...)")
        for name in ("add_timeout_s", "read_timeout_s", "metadata_read_retry_s"):
            if getattr(self, name) <= 0:
                problems.append(f"'{name}' must be positive")
        for name in ("speculative_read_timeout_ms", "max_outstanding_adds", "health_check_interval_s"):
            if getattr(self, name) < 0:
                problems.append(f"'{name}' must be >= 0 (0 disables it)")
        if self.bookie_error_threshold_per_interval < 1:
            problems.append("'bookie_error_threshold_per_interval' must be at least 1")
        if self.bookie_quarantine_time_s <= 0:
            problems.append("'bookie_quarantine_time_s' must be positive")
        from ledgerstore.proto.digest import SCRYPT_N_RANGE

        low, high = SCRYPT_N_RANGE
        cost = self.password_check_cost
        if not (low <= cost <= high and cost & (cost - 1) == 0):
            problems.append(f"'password_check_cost' = {cost} must be a power of two from {low} to {high}")
        problems.extend(duration_problems(self))
        return problems


def duration_problems(config: Any, prefix: str = "") -> list[str]:
    """One line for each duration of ``config`` (a config dataclass, nested ones included) that is
    not a finite number or is longer than :data:`~ledgerstore.api.options.MAX_DURATION_S`. A
    duration is a number field named ``*_ms`` or ``*_s`` (rates, ``*_per_s``, are not)."""
    problems = []
    for field in dataclasses.fields(config):
        name, value = field.name, getattr(config, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            problems.extend(duration_problems(value, f"{prefix}{name}."))
            continue
        if not name.endswith(("_ms", "_s")) or name.endswith("_per_s"):
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        unit, limit = ("ms", MAX_DURATION_S * 1000) if name.endswith("_ms") else ("s", MAX_DURATION_S)
        if not math.isfinite(value) or value > limit:
            problems.append(f"'{prefix}{name}' = {value} is too long: at most {limit:.0f} {unit} (366 days)")
    return problems


MAX_PORT = 65535
#: hosts that mean "every interface": a bookie may listen on them but never advertise them
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def address_problems(option: str, address: str, allow_any_port: bool = False) -> list[str]:
    """Problems of a ``scheme://host:port`` option: no scheme, no port, or a port out of range
    (``allow_any_port``: 0 asks for any free port)."""
    scheme, sep, rest = address.partition("://")
    host, colon, port = rest.rstrip("/").rpartition(":")
    if not sep or not scheme or not colon or not host or not port.isdigit():
        return [f"'{option}' = {address!r} is not an address like tcp://127.0.0.1:3181"]
    low = 0 if allow_any_port else 1
    if not low <= int(port) <= MAX_PORT:
        return [f"'{option}' = {address!r}: port {port} is not between {low} and {MAX_PORT}"]
    return []
