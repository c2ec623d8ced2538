"""The plugin interfaces (four backend slots and the protocol handlers). Plugins import from here (and from :mod:`ledgerstore.errors`)."""

from ledgerstore.api.files import OS_STORAGE_FILES, OsStorageFiles, StorageFile, StorageFiles
from ledgerstore.api.metadata import (
    ANY_VERSION,
    CHILDREN_PAGE,
    NOT_EXISTS,
    EventType,
    MetadataStore,
    Notification,
    NotificationCallback,
    SessionEvent,
    SessionListener,
    Subscription,
    Versioned,
)
from ledgerstore.api.options import (
    MAX_DURATION_S,
    OptionInfo,
    check_options,
    describe_options,
    option,
    options_for,
    parse_options,
)
from ledgerstore.api.placement import BookieInfo, PlacementPolicy
from ledgerstore.api.protocol import HandlerHealth, ProtocolHandler
from ledgerstore.api.storage import StorageEngine, StorageStats
from ledgerstore.api.transport import (
    DEFAULT_MAX_FRAME_SIZE,
    Connection,
    FrameHandler,
    Server,
    ServerConnection,
    ServerLimits,
    Transport,
    split_address,
)

__all__ = [
    "ANY_VERSION",
    "CHILDREN_PAGE",
    "DEFAULT_MAX_FRAME_SIZE",
    "NOT_EXISTS",
    "OS_STORAGE_FILES",
    "BookieInfo",
    "Connection",
    "EventType",
    "FrameHandler",
    "HandlerHealth",
    "MetadataStore",
    "Notification",
    "NotificationCallback",
    "PlacementPolicy",
    "ProtocolHandler",
    "Server",
    "OptionInfo",
    "OsStorageFiles",
    "ServerConnection",
    "ServerLimits",
    "SessionEvent",
    "SessionListener",
    "StorageEngine",
    "StorageFile",
    "StorageFiles",
    "StorageStats",
    "Subscription",
    "Transport",
    "Versioned",
    "MAX_DURATION_S",
    "check_options",
    "options_for",
    "parse_options",
    "describe_options",
    "option",
    "split_address",
]
