"""The bounded on-disk spool: records wait here until uploaded, across restarts and days offline.

A record is two files, `<id>.jpg` then `<id>.json`, each written atomically and synced; the `.json`
is its commit: a `.jpg` without one (a crash between) is removed at start, and so is a record whose
`.json` does not parse (a power loss can leave a renamed file empty where the disk did not sync).
Ids sort by age, so the oldest go first, both to the uploader and to the caps: over `max_bytes`, or
older than `max_age_s`, the oldest are dropped and counted; the counts are kept in `state.json` and
survive restarts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgeinfer.capture.counts import CaptureCounts
from edgeinfer.capture.record import Record
from edgeinfer.files import atomic_write

__all__ = ["Spool", "Spooled"]

log = logging.getLogger(__name__)

_STATE = "state.json"


@dataclass(frozen=True)
class Spooled:
    """A record waiting in the spool: its id, its key and its two files."""

    id: str
    key: str
    image: Path
    document: Path
    size: int


class Spool:
    def __init__(
        self,
        folder: Path,
        *,
        max_bytes: int,
        max_age_s: float,
        wall: Callable[[], float] = time.time,
        counts: CaptureCounts | None = None,
    ) -> None:
        self.folder = folder
        self.counts = counts or CaptureCounts()
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.wall = wall
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}  # id -> bytes of both files, oldest first once sorted
        self.dropped = {"size": 0, "age": 0}
        self.unreadable = 0  # records removed at start: their document did not parse
        self.folder.mkdir(parents=True, exist_ok=True)
        self._load()

    # ------------------------------------------------------------------------------------- reading

    def _load(self) -> None:
        try:
            state = json.loads((self.folder / _STATE).read_text())
            self.dropped.update({k: int(state.get("dropped", {}).get(k, 0)) for k in self.dropped})
        except (OSError, ValueError):
            pass
        sizes: dict[str, int] = {}
        for path in self.folder.iterdir():
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a write a crash interrupted
            elif path.suffix == ".json" and path.name != _STATE:
                image = path.with_suffix(".jpg")
                if not _readable(path):
                    self.unreadable += 1
                    log.warning("capture spool: dropped record %s, its document does not parse", path.stem)
                    path.unlink(missing_ok=True)  # its image goes below, with the other orphans
                elif image.exists():
                    sizes[path.stem] = path.stat().st_size + image.stat().st_size
                else:
                    path.unlink(missing_ok=True)
        for path in self.folder.glob("*.jpg"):
            if path.stem not in sizes:
                path.unlink(missing_ok=True)  # its document never came: the record was not made
        self._sizes = dict(sorted(sizes.items()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._sizes)

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def pending(self) -> list[Spooled]:
        """The records waiting, oldest first."""
        with self._lock:
            ids = list(self._sizes.items())
        out = []
        for record_id, size in ids:
            doc = self.folder / f"{record_id}.json"
            try:
                key = str(json.loads(doc.read_bytes())["key"])
            except (OSError, ValueError, KeyError):
                continue  # dropped meanwhile
            out.append(Spooled(record_id, key, doc.with_suffix(".jpg"), doc, size))
        return out

    # ------------------------------------------------------------------------------------- writing

    def put(self, record: Record) -> None:
        doc = dict(record.doc, key=record.key)
        body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        # Both synced, the image first: after a power loss the document's presence must mean both
        # files hold what was written.
        atomic_write(self.folder / f"{record.id}.jpg", record.image, fsync=True)
        atomic_write(self.folder / f"{record.id}.json", body, fsync=True)
        with self._lock:
            self._sizes[record.id] = len(body) + len(record.image)
        self.enforce()

    def remove(self, record_id: str) -> None:
        """Uploaded: gone from the spool (the document first, so a crash leaves no half record)."""
        with self._lock:
            self._sizes.pop(record_id, None)
        for ext in (".json", ".jpg"):
            (self.folder / f"{record_id}{ext}").unlink(missing_ok=True)

    def enforce(self) -> int:
        """Drop what is over the caps, oldest first; the number dropped."""
        cutoff_ms = int((self.wall() - self.max_age_s) * 1000)
        gone: list[tuple[str, str]] = []
        with self._lock:
            total = sum(self._sizes.values())
            for record_id in list(self._sizes):
                if _ms(record_id) < cutoff_ms:
                    why = "age"
                elif total > self.max_bytes:
                    why = "size"
                else:
                    break
                total -= self._sizes.pop(record_id)
                self.dropped[why] += 1
                gone.append((record_id, why))
        for record_id, why in gone:
            for ext in (".json", ".jpg"):
                (self.folder / f"{record_id}{ext}").unlink(missing_ok=True)
            self.counts.add(f"dropped_{why}")
        if gone:
            log.warning("capture spool: dropped %d records (oldest first) to stay within its caps", len(gone))
            self._save()
        return len(gone)

    def dropped_counts(self) -> dict[str, int]:
        """Since the spool was made, across restarts."""
        with self._lock:
            return dict(self.dropped)

    def _save(self) -> None:
        with self._lock:
            state = json.dumps({"dropped": self.dropped}).encode()
        try:
            atomic_write(self.folder / _STATE, state)
        except OSError as exc:
            log.warning("capture spool: state not saved: %s", exc)


def _readable(document: Path) -> bool:
    try:
        return isinstance(json.loads(document.read_bytes()).get("key"), str)
    except (OSError, ValueError, AttributeError):
        return False


def _ms(record_id: str) -> int:
    head = record_id.split("-", 1)[0]
    return int(head) if head.isdigit() else 0
