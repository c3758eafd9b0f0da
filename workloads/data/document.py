"""A document of a corpus: what every reader of a collection gives."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """The "flat" text that BM25 indexes and the cross-encoder reads: title + text."""
        return f"{self.title} {self.text}" if self.title else self.text


__all__ = ["Document"]
