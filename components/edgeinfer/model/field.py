"""A field set: captured records pulled home by `edgeinfer capture pull`, as the model build reads them.

The folder mirrors the records' S3 keys below the capture prefix
(`<thing>/<model>/<version>/<yyyy>/<mm>/<dd>/<id>.{jpg,json}`) and holds `capture-manifest.json`,
which lists every complete record (both files on disk) and the pulls that brought them. The pull
writes it, the build reads it: one format, here, beside the build that depends on it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import atomic_write

__all__ = ["FIELD_MANIFEST", "FORMAT", "FieldRecord", "FieldSet", "FieldSetError"]

FIELD_MANIFEST = "capture-manifest.json"
FORMAT = "edgeinfer-capture/1"


class FieldSetError(EdgeinferError):
    """A capture folder whose manifest does not read."""


@dataclass(frozen=True)
class FieldRecord:
    id: str
    key: str  # the S3 key without its extension
    thing: str
    model: str
    version: str
    captured_at: str  # ISO 8601, UTC
    image: str  # relative to the folder
    document: str
    bytes: int  # both files

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> FieldRecord:
        return cls(
            id=str(doc["id"]),
            key=str(doc["key"]),
            thing=str(doc["thing"]),
            model=str(doc["model"]),
            version=str(doc["version"]),
            captured_at=str(doc["captured_at"]),
            image=str(doc["image"]),
            document=str(doc["document"]),
            bytes=int(doc["bytes"]),
        )


@dataclass
class FieldSet:
    folder: Path
    records: list[FieldRecord] = field(default_factory=list)
    pulls: list[dict[str, Any]] = field(default_factory=list)  # what each pull asked for, and when

    @classmethod
    def load(cls, folder: Path) -> FieldSet | None:
        """The field set in `folder`, or None when it is not a pulled capture folder."""
        path = folder / FIELD_MANIFEST
        if not path.is_file():
            return None
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(f"not {FORMAT}")
            records = [FieldRecord.from_dict(r) for r in doc["records"]]
            pulls = [dict(p) for p in doc.get("pulls", [])]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise FieldSetError(f"capture folder {folder}: {FIELD_MANIFEST} does not read ({exc})") from None
        return cls(folder, records, pulls)

    def save(self) -> None:
        doc = {
            "format": FORMAT,
            "pulls": self.pulls,
            "records": [asdict(r) for r in sorted(self.records, key=lambda r: r.key)],
        }
        atomic_write(self.folder / FIELD_MANIFEST, json.dumps(doc, indent=1).encode())

    def image_paths(self) -> list[Path]:
        """Oldest first (a build that takes fewer keeps the earliest), then by key."""
        return [self.folder / r.image for r in sorted(self.records, key=lambda r: (r.captured_at, r.key))]

    def summary(self) -> dict[str, Any]:
        """What a gate report says of the set: where, how many records, from which things and models."""
        return {
            "folder": str(self.folder),
            "records": len(self.records),
            "things": sorted({r.thing for r in self.records}),
            "models": sorted({f"{r.model} {r.version}" for r in self.records}),
            "captured": [
                min((r.captured_at for r in self.records), default=""),
                max((r.captured_at for r in self.records), default=""),
            ],
        }
