"""``ledgerstore shell``: BookKeeper-shell-style administration commands.

This module holds the command group, BookKeeper's single-dash long flags and the list of commands;
the commands live by topic in ``shell_*.py`` next to it (bookies, ledgers, the cluster's instance,
a bookie's own directories, auto-recovery, recover and decommission, cookies, metadata transfer),
and ``shell_context.py`` holds what each is handed.
"""

from __future__ import annotations

import click

from ledgerstore.cli.shell_autorecovery import (
    autorecovery_switch,
    forceauditchecks,
    listunderreplicated,
    lostbookierecoverydelay,
    queryautorecoverystatus,
    triggeraudit,
    whoisauditor,
)
from ledgerstore.cli.shell_bookies import bookieinfo, bookiesanity, endpointinfo, listbookies, simpletest
from ledgerstore.cli.shell_cluster import clusterinfo, cookie_delete, cookie_get
from ledgerstore.cli.shell_context import ShellContext
from ledgerstore.cli.shell_cookies import generatecookie, updatecookie
from ledgerstore.cli.shell_disk import (
    bookieformat,
    gc_command,
    initbookie,
    lastmark,
    limbo,
    listfilesondisc,
    localconsistencycheck,
    readjournal,
)
from ledgerstore.cli.shell_health import healthcheck
from ledgerstore.cli.shell_instance import initnewcluster, metaformat, nukeexistingcluster, whatisinstanceid
from ledgerstore.cli.shell_ledger_ops import deleteledger, ledgermetadata, listledgers, readledger
from ledgerstore.cli.shell_ledgers import updatebookieinledger, updateledgers
from ledgerstore.cli.shell_metadata import metadata_copy, metadata_export, metadata_import
from ledgerstore.cli.shell_recover import decommissionbookie, recover
from ledgerstore.cli.shell_storage import activeledgers, ledger_index, readlogmetadata

# BookKeeper's shell spells long options with one dash (``-ledgerid 4``, ``-deleteCookie``); these are
# rewritten to our double-dash names before click parses, so both spellings work.
BOOKKEEPER_LONG_FLAGS = {
    "ledgerid": "--ledgerid", "bookieid": "--bookieid", "firstentryid": "--firstentryid",
    "lastentryid": "--lastentryid", "deletecookie": "--delete-cookie", "force": "--force",
    "readwrite": "--readwrite", "readonly": "--readonly", "all": "--all", "hostnames": "--hostnames",
    "meta": "--meta", "instanceid": "--instanceid", "replicascheck": "--replicascheck",
    "recovery": "--recovery", "password": "--password", "missing": "--missing", "query": "--query",
    "dryrun": "--dryrun", "verbose": "--verbose", "noninteractive": "--nonInteractive", "limit": "--limit",
    "srcbookie": "--srcBookie", "destbookie": "--destBookie", "expandstorage": "--expandstorage", "list": "--list",
    "output": "--output", "skipopenledgers": "--skipOpenLedgers", "ledger": "--ledger",
    "updatespersec": "--updatespersec", "printprogress": "--printprogress", "enable": "--enable",
    "disable": "--disable", "status": "--status", "logid": "--logId", "logfilename": "--logFilename",
    "ensemble": "--ensemble", "writequorum": "--writeQuorum", "ackquorum": "--ackQuorum",
    "numentries": "--numEntries", "dumptofile": "--dumptofile", "restorefromfile": "--restorefromfile",
    "update": "--update", "msg": "--msg", "force-recovery": "--force-recovery",
    "missingreplica": "--missingreplica", "excludingmissingreplica": "--excludingmissingreplica",
    "printmissingreplica": "--printmissingreplica", "printreplicationworkerid": "--printreplicationworkerid",
    "onlydisplayledgercount": "--onlydisplayledgercount", "entries": "--entries", "timeout": "--timeout",
    "get": "--get", "set": "--set", "checkallledgerscheck": "--checkallledgerscheck", "journal": "--journal",
    "entrylog": "--entrylog", "index": "--index", "bookie": "--bookie",
}


def normalize_bookkeeper_flags(args: list[str]) -> list[str]:
    """``-ledgerid`` -> ``--ledgerid`` (and the other BookKeeper long flags, any case); other
    arguments are left alone, so short flags (``-l``) and values keep their meaning."""
    out = []
    for a in args:
        name, eq, value = a[1:].partition("=")
        long = BOOKKEEPER_LONG_FLAGS.get(name.lower()) if a.startswith("-") and not a.startswith("--") else None
        out.append(long + eq + value if long else a)
    return out


class BookKeeperFlagsGroup(click.Group):
    """A command group that also accepts BookKeeper's single-dash long flags."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = normalize_bookkeeper_flags(args)
        self._refuse_unknown_words(args)
        return super().parse_args(ctx, args)

    def _refuse_unknown_words(self, args: list[str]) -> None:
        # click reads an unknown ``-nosuchflag`` as the short flags -n -o -s ... and names only ``-n``;
        # name the whole word instead.
        params = [p for c in [self, *self.commands.values()] for p in c.params if isinstance(p, click.Option)]
        known = {o for p in params for o in p.opts + p.secondary_opts}
        takes_value = {o for p in params if not p.is_flag for o in p.opts}
        for prev, a in zip(["", *args[:-1]], args, strict=True):
            if (a.startswith("-") and not a.startswith("--") and len(a) > 2 and a[1:].isalpha()
                    and a not in known and prev not in takes_value):
                raise click.UsageError(f"no such option {a!r} (BookKeeper's single-dash long flags known here: "
                                       f"{', '.join('-' + k for k in sorted(BOOKKEEPER_LONG_FLAGS))})")


@click.group(cls=BookKeeperFlagsGroup)
@click.option("--metadata", envvar="LEDGERSTORE_METADATA", help="metadata store URI (or $LEDGERSTORE_METADATA)")
@click.option("--config", type=click.Path(dir_okay=False), help="client TOML config, or a bookie's (its metadata URI is used)")
@click.pass_context
def shell(ctx: click.Context, metadata: str | None, config: str | None) -> None:
    """Administration commands (named as in `bookkeeper shell`)."""
    ctx.obj = ShellContext(metadata, config)


shell.add_command(simpletest)
shell.add_command(listbookies)
shell.add_command(bookieinfo)
shell.add_command(endpointinfo)
shell.add_command(bookiesanity)
shell.add_command(listledgers)
shell.add_command(ledgermetadata)
shell.add_command(readledger)
shell.add_command(deleteledger)
shell.add_command(whatisinstanceid)
shell.add_command(initnewcluster)
shell.add_command(metaformat)
shell.add_command(nukeexistingcluster)
shell.add_command(localconsistencycheck)
shell.add_command(lastmark)
shell.add_command(limbo)
shell.add_command(listfilesondisc)
shell.add_command(readjournal)
shell.add_command(bookieformat)
shell.add_command(initbookie)
shell.add_command(gc_command)
shell.add_command(listunderreplicated)
shell.add_command(whoisauditor)
shell.add_command(triggeraudit)
shell.add_command(forceauditchecks)
shell.add_command(queryautorecoverystatus)
shell.add_command(autorecovery_switch)
shell.add_command(lostbookierecoverydelay)
shell.add_command(recover)
shell.add_command(decommissionbookie)
shell.add_command(updatebookieinledger)
shell.add_command(updatebookieinledger, "updateBookieInLedger")
shell.add_command(updateledgers)
shell.add_command(healthcheck)
shell.add_command(readlogmetadata)
shell.add_command(activeledgers)
shell.add_command(ledger_index)
shell.add_command(updatecookie)
shell.add_command(generatecookie)
shell.add_command(metadata_export)
shell.add_command(metadata_import)
shell.add_command(metadata_copy)
shell.add_command(clusterinfo)
shell.add_command(cookie_get)
shell.add_command(cookie_delete)
