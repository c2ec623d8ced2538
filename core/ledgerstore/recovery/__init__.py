"""Auto-recovery: the auditor (elected), replication workers, under-replication markers and
decommissioning, built once on the MetadataStore primitive (see docs/autorecovery.md)."""

from ledgerstore.recovery.markers import Marker, ReplicationError, UnderReplicationManager

__all__ = ["Marker", "ReplicationError", "UnderReplicationManager"]
