"""ledgerstore-example-plugin: a round-robin placement policy and a ledger-event hook.

Nothing here is imported by ledgerstore directly: both parts are found through the entry points
declared in this distribution's ``pyproject.toml``.
"""

from ledgerstore_example_plugin.placement import RoundRobinPlacement

__all__ = ["RoundRobinPlacement"]
__version__ = "0.1.0"
