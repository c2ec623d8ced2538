"""ledgerstore's Kafka front end: Kafka clients, unchanged, on ledgerstore logs.

A protocol handler plugin (entry point ``kafka`` in ``ledgerstore.protocol``): :class:`KafkaHandler`.
Modules: :mod:`.codec` (Kafka's primitive types), :mod:`.messages` (the requests and responses
served, and the version table), :mod:`.records` (record batches), :mod:`.partition` (a topic
partition on a log), :mod:`.broker` (connections and requests), :mod:`.cli` (``ledgerstore kafka``).
See ``docs/kafka.md``.
"""

from ledgerstore_kafka.handler import KafkaHandler

__all__ = ["KafkaHandler"]
