"""The ProtocolHandler interface: a front end that serves another wire protocol over ledgerstore.

A protocol handler (Pulsar's PIP-41 did the same on BookKeeper) is a plugin of the entry-point
group ``ledgerstore.protocol``. The host builds it from a started client (:class:`ledgerstore.aio.Client`)
and the handler's own option table, parsed once into the ``Options`` dataclass it declares
(see :mod:`ledgerstore.api.options`), then calls :meth:`ProtocolHandler.start`, which opens the
handler's own listener; :meth:`ProtocolHandler.stop` closes it and everything it opened.

Neighbours: :mod:`ledgerstore.plugins` finds handlers (slot ``protocol``),
:mod:`ledgerstore.testing.protocol` is the conformance suite every handler subclasses,
``ledgerstore standalone --<name>-port`` and the handler's own command run them.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

__all__ = ["HandlerHealth", "ProtocolHandler"]


@dataclasses.dataclass(frozen=True, slots=True)
class HandlerHealth:
    """What :meth:`ProtocolHandler.health` reports: ``ok`` while the handler serves, and a
    one-line ``detail`` saying what it serves or what is wrong."""

    ok: bool
    detail: str


class ProtocolHandler(abc.ABC):
    """Serves one wire protocol on its own listener, storing and reading through a client.

    Construction is ``cls(client, options)``: ``client`` is a started :class:`ledgerstore.aio.Client`
    (typed ``Any`` here because the interfaces sit below the client in the layers), ``options`` an
    instance of the class's ``Options`` dataclass, which must have the fields ``host`` (str) and
    ``port`` (int, 0 for any free port). Bad options are refused before construction by the host
    (:func:`ledgerstore.plugins.plugin_options`), one line naming the plugin and the option.

    Contract:

    - :meth:`start` binds the listener (``host``, by default 127.0.0.1) and returns once it accepts
      connections; a port in use raises :class:`OSError`. :attr:`address` is then the bound address.
    - A connection that sends bytes the protocol cannot parse is closed (or answered with the
      protocol's error) without harm to the other connections or to the handler.
    - :meth:`stop` closes the listener and every connection, releases what the handler opened
      (log writers, readers) and returns; calling it twice is harmless.
    - :meth:`health` and :meth:`metrics_lines` never raise and never block.
    """

    #: the protocol's name, as in the entry point (``kafka``)
    name: ClassVar[str] = ""
    #: counters of the metadata store this handler allocates from (``store.next_id(name)``); a
    #: metadata move (``shell metadata export``/``copy``) carries them past their values, so an id
    #: handed out before the move is never handed out again after it
    metadata_counters: ClassVar[tuple[str, ...]] = ()

    def __init__(self, client: Any, options: Any) -> None:
        self.client = client
        self.options = options

    @abc.abstractmethod
    async def start(self) -> None:
        """Open the listener on the configured host and port; return once it accepts connections."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Close the listener and every connection, and release what the handler holds."""

    @property
    @abc.abstractmethod
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the listener is bound to; the port chosen when ``port`` was 0.
        :class:`RuntimeError` before :meth:`start`."""

    @abc.abstractmethod
    def health(self) -> HandlerHealth:
        """Whether the handler serves now, with a one-line detail."""

    @abc.abstractmethod
    def metrics_lines(self) -> list[str]:
        """The handler's metrics in Prometheus text format, one sample per line, each name
        prefixed ``ledgerstore_<protocol>_`` (``# HELP`` and ``# TYPE`` lines allowed)."""
