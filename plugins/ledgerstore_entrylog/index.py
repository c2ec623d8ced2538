"""Per-ledger index files: a 512-byte header, then fixed-size pages of u64 entry locations.

Slot ``e`` of the file (page ``e // slots_per_page``) holds ``((log_id << 32) | offset) + 1`` for
entry ``e``; 0 means absent. A page is written as the range of its slots that changed, not
whole. The ledger cache keeps a bounded number of index files open
(:mod:`~ledgerstore_entrylog.index_files`), so a bookie with many ledgers does not hold a
descriptor per ledger; the checkpoint opens its own for each batch of pages. Every operation goes through the engine's file port
(:class:`~ledgerstore.api.StorageFiles`), so the index runs over simulated files as well.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from pathlib import Path

from ledgerstore.api import StorageFile, StorageFiles
from ledgerstore.errors import BookieIOError, storage_write_error
from ledgerstore_entrylog.format import (
    INDEX_HEADER_SIZE,
    IndexHeader,
    decode_index_header,
    page_from_bytes,
    page_to_disk,
)

__all__ = ["PageRange", "read_header", "read_page", "read_page_from", "read_last_pages", "write_index", "write_ranges",
           "fsync_file", "fsync_dir"]


def read_header(files: StorageFiles, path: Path) -> tuple[IndexHeader, int]:
    """The decoded header and the file size; BookieIOError naming the file if damaged."""
    try:
        f = files.open(path, write=False)
        try:
            raw = f.pread(INDEX_HEADER_SIZE, 0)
            size = f.size()
        finally:
            f.close()
    except OSError as exc:
        raise BookieIOError(f"cannot read index file {path}: {exc}") from exc
    return decode_index_header(raw, path), size


def read_page(files: StorageFiles, path: Path, page_no: int, page_size: int) -> array[int]:
    """Page ``page_no`` of an index file (zeros where the file is short or sparse)."""
    try:
        f = files.open(path, write=False)
    except FileNotFoundError:
        return page_from_bytes(b"", page_size // 8)
    except OSError as exc:
        raise BookieIOError(f"cannot open index file {path}: {exc}") from exc
    try:
        return read_page_from(f, path, page_no, page_size)
    finally:
        f.close()


def read_page_from(f: StorageFile, path: Path, page_no: int, page_size: int) -> array[int]:
    """Page ``page_no`` of the open index file ``f`` at ``path`` (zeros where it is short)."""
    try:
        raw = f.pread(page_size, INDEX_HEADER_SIZE + page_no * page_size)
    except OSError as exc:
        raise BookieIOError(f"read of page {page_no} of index file {path} failed: {exc}") from exc
    return page_from_bytes(raw, page_size // 8)


def read_last_pages(files: StorageFiles, path: Path, file_size: int,
                    page_size: int) -> Iterable[tuple[int, array[int]]]:
    """Pages of an index file from the last one backwards (used to find the last entry at open)."""
    n_pages = (file_size - INDEX_HEADER_SIZE + page_size - 1) // page_size
    for page_no in range(n_pages - 1, -1, -1):
        yield page_no, read_page(files, path, page_no, page_size)


#: what is written of one page: its number, its slots, and the first and last slot (inclusive)
#: of the range written; the other slots are already in the file
PageRange = tuple[int, "array[int]", int, int]


def write_index(files: StorageFiles, path: Path, header: bytes | None, pages: Iterable[PageRange],
                page_size: int, keep_open: bool) -> StorageFile | None:
    """Write the header (if given) and the pages' slot ranges in place, creating the file if
    needed. Returns the still-open file when ``keep_open`` (the caller syncs and closes it),
    else None."""
    try:
        f = files.open(path, create=True)
    except OSError as exc:
        raise storage_write_error(f"cannot open index file {path} for writing", exc) from exc
    try:
        write_ranges(f, path, header, pages, page_size)
    except BaseException:
        f.close()
        raise
    if keep_open:
        return f
    f.close()
    return None


def write_ranges(f: StorageFile, path: Path, header: bytes | None, pages: Iterable[PageRange],
                 page_size: int) -> None:
    """Write the header (if given) and, of each page, the bytes of its slots ``first..last``,
    to the open index file ``f`` at ``path``; no sync. An error is the storage error naming
    the file (BookieDiskFullError for a full disk)."""
    try:
        if header is not None:
            pwrite_all(f, header, 0)
        for page_no, page, first, last in pages:
            raw = memoryview(page_to_disk(page)).cast("B")
            try:
                pwrite_all(f, raw[first * 8 : (last + 1) * 8], INDEX_HEADER_SIZE + page_no * page_size + first * 8)
            finally:
                raw.release()
    except OSError as exc:
        raise storage_write_error(f"write to index file {path} failed", exc) from exc


def read_file(files: StorageFiles, path: Path) -> bytes:
    """The whole of a small file (a ledger map). Raises OSError (FileNotFoundError)."""
    f = files.open(path, write=False)
    try:
        return f.pread(f.size(), 0)
    finally:
        f.close()


def pwrite_all(f: StorageFile, data: bytes | bytearray | memoryview | array[int], offset: int) -> None:
    """Write all of ``data`` at ``offset``: a short write (a disk filling up) is continued, and
    one that cannot go on raises the OSError of the call that wrote nothing."""
    view = memoryview(data)
    try:
        while view:
            n = f.pwrite(view, offset)
            offset += n
            view = view[n:]
    finally:
        view.release()


def fsync_file(files: StorageFiles, path: Path) -> None:
    """Sync a file by path (fsync covers every descriptor's writes to the inode); a file deleted
    in the meantime needs no syncing."""
    try:
        f = files.open(path, write=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BookieIOError(f"cannot open {path} to fsync it: {exc}") from exc
    try:
        f.sync()
    except OSError as exc:
        raise BookieIOError(f"fsync of {path} failed: {exc}") from exc
    finally:
        f.close()


def fsync_dir(files: StorageFiles, path: Path) -> None:
    """Sync a directory so that file creations and deletions in it are durable."""
    try:
        files.sync_dir(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BookieIOError(f"fsync of directory {path} failed: {exc}") from exc


def remove_file(files: StorageFiles, path: Path) -> None:
    """Delete ``path``; already gone is fine, any other failure is a BookieIOError."""
    try:
        files.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise BookieIOError(f"cannot delete {path}: {exc}") from exc
