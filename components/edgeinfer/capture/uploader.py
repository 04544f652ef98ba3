"""The uploader thread: the spool's records to S3, oldest first, paced, each once.

A record goes as its `.jpg`, then its `.json` (a listing of `.json` keys finds whole records), under
its fixed key; only then is it removed from the spool. A crash or an outage between leaves it in the
spool and the next try writes the same keys again: an object is replaced, never duplicated. Failures
back off (doubling to a minute); bytes are paced to `bytes_per_s` so uploads leave the device's
uplink (and CPU) to serving.
"""

from __future__ import annotations

import logging
import threading

from edgeinfer.capture.counts import CaptureCounts
from edgeinfer.capture.s3 import S3Client
from edgeinfer.capture.spool import Spool, Spooled
from edgeinfer.pacing import TokenBucket

__all__ = ["Uploader"]

log = logging.getLogger(__name__)


class Uploader:
    def __init__(
        self,
        spool: Spool,
        client: S3Client,
        *,
        bytes_per_s: float,
        idle_s: float = 1.0,
        max_backoff_s: float = 60.0,
        counts: CaptureCounts | None = None,
    ) -> None:
        self.spool = spool
        self.client = client
        self.pacer = TokenBucket(bytes_per_s, bytes_per_s)  # a second's worth may go at once
        self.counts = counts or spool.counts
        self.idle_s = idle_s
        self.max_backoff_s = max_backoff_s
        self.uploaded = 0
        self.uploaded_bytes = 0
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()  # the counters: telemetry reads them from another thread
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Uploader:
        self._thread = threading.Thread(target=self._run, name="edgeinfer-capture-upload", daemon=True)
        self._thread.start()
        return self

    def poke(self) -> None:
        """A record was spooled: look now, not at the next idle tick."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            try:
                sent = self.drain()
                backoff = 0.0
            except Exception as exc:
                # Not only S3Error: a cut-short HTTP read or an unreadable spool file must not end the thread.
                with self._lock:
                    self.failures += 1
                    self.last_error = str(exc)
                self.counts.add("upload_failures")
                backoff = min(self.max_backoff_s, max(1.0, backoff * 2))
                log.warning("capture upload failed (retrying in %.0f s): %s", backoff, exc)
                self._stop.wait(backoff)
                continue
            if not sent:
                self._wake.wait(self.idle_s)
                self._wake.clear()

    def drain(self) -> int:
        """Upload what the spool holds now, oldest first; the records sent. Raises at the first failure
        (S3Error for S3's; what is left stays spooled)."""
        sent = 0
        self.spool.enforce()  # records age out during an outage too, not only when one is added
        for item in self.spool.pending():
            if self._stop.is_set():
                break
            if self.upload(item):
                sent += 1
        return sent

    def upload(self, item: Spooled) -> bool:
        """One record; False when it left the spool meanwhile (dropped by a cap) or a stop came first."""
        try:
            image = item.image.read_bytes()
            doc = item.document.read_bytes()
        except FileNotFoundError:
            return False
        # A stop ends a pacing wait at once (a slow uplink's debt can be minutes): the record stays
        # spooled, and the next start writes both keys again.
        if not self.pacer.take_unless(len(image), self._stop):
            return False
        self.client.put(item.key + ".jpg", image, "image/jpeg")
        if not self.pacer.take_unless(len(doc), self._stop):
            return False
        self.client.put(item.key + ".json", doc, "application/json")
        self.spool.remove(item.id)
        with self._lock:
            self.uploaded += 1
            self.uploaded_bytes += len(image) + len(doc)
        self.counts.add("uploaded")
        return True
