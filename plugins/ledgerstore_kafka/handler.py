"""``KafkaHandler``: the ``kafka`` protocol handler (entry point ``ledgerstore.protocol``).

Built by the host from a started client and its parsed :class:`KafkaHandler.Options`; serves the
Kafka wire protocol on its own listener (:mod:`ledgerstore_kafka.broker`), each topic partition a
ledgerstore log (:mod:`ledgerstore_kafka.partition`). See ``docs/kafka.md``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, ClassVar

from ledgerstore.api import option
from ledgerstore.api.protocol import HandlerHealth, ProtocolHandler
from ledgerstore_kafka.broker import PRODUCER_ID_COUNTER, Broker, BrokerSettings
from ledgerstore_kafka.partition import LogSettings
from ledgerstore_kafka.sasl import check_mechanisms, sasl_settings
from ledgerstore_kafka.tls import server_context

__all__ = ["KafkaHandler"]

#: Kafka's defaults: message.max.bytes (one record batch) and socket.request.max.bytes (one request)
KAFKA_MAX_BATCH_BYTES = 1_048_588
KAFKA_MAX_REQUEST_BYTES = 104_857_600


class KafkaHandler(ProtocolHandler):
    """A Kafka broker whose partitions are ledgerstore logs."""

    name: ClassVar[str] = "kafka"
    metadata_counters: ClassVar[tuple[str, ...]] = (PRODUCER_ID_COUNTER,)

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``[kafka]`` table of ``kafka.toml`` (``standalone --kafka-port`` sets ``port``).

        ``host``/``port``: where to listen; ``advertised_host``: the host Metadata answers name
        (default ``host``); ``node_id`` and ``cluster_id``: this broker's identity in Metadata;
        ``auto_create_topics``/``num_partitions``: a topic a client asks for is created with that
        many partitions; ``max_batch_bytes``: a larger record batch is refused with
        ``MESSAGE_TOO_LARGE``; ``max_request_bytes``: a larger frame closes the connection;
        ``cache_bytes``: recent batches kept in memory per partition; ``log_password``,
        ``ensemble``, ``write_quorum``, ``ack_quorum``: how the partitions' logs are opened;
        ``tls_cert_file``/``tls_key_file`` (and ``tls_ca_file`` for client certificates): TLS;
        ``sasl_mechanisms`` and ``credentials_file``: clients authenticate with SASL as a user of
        that file (:mod:`ledgerstore_kafka.sasl`).
        """

        host: str = option("127.0.0.1", "address to listen on")
        port: int = option(9092, "port to listen on (0: any free port)", minimum=0, maximum=65535)
        advertised_host: str = option("", "host clients are told to connect to (default: the listening host)")
        node_id: int = option(0, "this broker's node id in Metadata answers", minimum=0, maximum=2**31 - 1)
        cluster_id: str = option("ledgerstore", "the cluster id in Metadata answers")
        auto_create_topics: bool = option(True, "create a topic a client asks Metadata for when it does not exist")
        num_partitions: int = option(1, "partitions of an auto-created topic", minimum=1, maximum=10_000)
        max_batch_bytes: int = option(KAFKA_MAX_BATCH_BYTES, "largest record batch accepted (MESSAGE_TOO_LARGE above)",
                                      minimum=128, maximum=64 << 20)
        max_request_bytes: int = option(KAFKA_MAX_REQUEST_BYTES, "largest request frame; a larger one closes the "
                                        "connection", minimum=1024, maximum=1 << 30)
        cache_bytes: int = option(64 << 20, "bytes of recent record batches kept in memory per partition",
                                  minimum=0, maximum=1 << 40)
        log_password: str = option("", "password of the partitions' logs")
        ensemble: int = option(0, "ensemble size of the partitions' ledgers (0: the client's default)", minimum=0)
        write_quorum: int = option(0, "write quorum (0: the client's default)", minimum=0)
        ack_quorum: int = option(0, "ack quorum; acks=all and acks=1 wait for it (0: the client's default)", minimum=0)
        tls_cert_file: str = option("", "PEM certificate of the listener: with tls_key_file, clients connect over TLS")
        tls_key_file: str = option("", "PEM private key of tls_cert_file")
        tls_ca_file: str = option("", "PEM CA bundle: clients must present a certificate it signed")
        sasl_mechanisms: list[str] = option([], "SASL mechanisms clients must authenticate with (PLAIN, "
                                            "SCRAM-SHA-256, SCRAM-SHA-512); empty: no authentication")
        credentials_file: str = option("", "the users SASL accepts (`ledgerstore credentials add NAME --file F`)")

        def __post_init__(self) -> None:
            check_mechanisms(self.sasl_mechanisms, self.credentials_file)

    def __init__(self, client: Any, options: Options) -> None:
        super().__init__(client, options)
        o = options
        self.broker = Broker(client, BrokerSettings(
            node_id=o.node_id, cluster_id=o.cluster_id, auto_create_topics=o.auto_create_topics,
            num_partitions=o.num_partitions, max_batch_bytes=o.max_batch_bytes,
            max_request_bytes=o.max_request_bytes,
            logs=LogSettings(o.log_password.encode(), o.ensemble, o.write_quorum, o.ack_quorum, o.cache_bytes),
            sasl=sasl_settings(o.sasl_mechanisms, o.credentials_file)))
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None
        self._stopped = False

    async def start(self) -> None:
        o = self.options
        tls = server_context(o.tls_cert_file, o.tls_key_file, o.tls_ca_file)
        self._server = await asyncio.start_server(self._connection, o.host, o.port, ssl=tls)
        sock = self._server.sockets[0].getsockname()
        self._address = (str(sock[0]), int(sock[1]))
        self.broker.advertised = (self.options.advertised_host or self._address[0], self._address[1])
        await self.broker.registry.start(*self.broker.advertised)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.broker.connections.add(task)
        try:
            await self.broker.serve_connection(reader, writer)
        finally:
            self.broker.connections.discard(task)

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError("the Kafka handler has not started")
        return self._address

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.broker.registry.stop()
        if self._server is not None:
            self._server.close()
        for task in list(self.broker.connections):
            task.cancel()
        if self.broker.connections:
            await asyncio.wait(list(self.broker.connections), timeout=10)
        if self._server is not None:
            await self._server.wait_closed()
        await self.broker.close()

    def health(self) -> HandlerHealth:
        if self._stopped or self._server is None or not self._server.is_serving():
            return HandlerHealth(False, "the Kafka listener is not serving")
        failed = [p.name for p in self.broker.partitions.values() if p.failed is not None]
        host, port = self.address
        detail = f"Kafka on {host}:{port}, {len(self.broker.partitions)} partitions open"
        if failed:
            detail += f", {len(failed)} to reopen ({', '.join(sorted(failed)[:3])})"
        return HandlerHealth(True, detail)

    def metrics_lines(self) -> list[str]:
        lines = [f"ledgerstore_kafka_connections_open {len(self.broker.connections)}",
                 f"ledgerstore_kafka_partitions_open {len(self.broker.partitions)}"]
        for name, value in sorted(self.broker.counters.items()):
            lines.append(f"ledgerstore_kafka_{name} {value}")
        return lines
