"""The versioned metadata format: a chain of body schemas joined by pure upgrade functions.

Reading version N of a format whose newest version is M: check the envelope, validate the body
with version N's schema, then apply the upgrades N->N+1, ..., M-1->M and decode the version M
body into a CheckpointRecord. Writing always uses the newest version. Adding a version means
adding one schema, one upgrade function and switching encode/decode; no serializer hierarchy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from airflow_finalckpt.core.errors import MetadataError
from airflow_finalckpt.core.metadata.envelope import open_envelope, parse_json, seal
from airflow_finalckpt.core.model import CheckpointRecord

#: Turns the previous version's body (an instance of its schema) into this version's body.
Upgrade = Callable[[Any], BaseModel]

#: The largest ``_metadata`` file read (10,000 stages x 100 splits write about 1.4 MB): a
#: bigger file is corrupt or hostile and is refused before it is parsed.
MAX_METADATA_BYTES = 64 << 20


@dataclass(frozen=True)
class BodyVersion:
    """One format version: its body schema and the upgrade from the version before it."""

    version: int
    schema: type[BaseModel]
    upgrade_from_previous: Upgrade | None = None
    #: How the file is indented (version 1: 2, for humans; later versions are compact: at
    #: 10,000 stages indentation alone costs megabytes; ``finalckpt checkpoints show`` reads).
    indent: int | None = 2


def describe_validation_error(exc: ValidationError, *, prefix: str = "body", limit: int = 5) -> str:
    """Pydantic's errors as 'body.stages.a.status: Input should be ...; ...', capped."""
    parts = []
    for error in exc.errors(include_url=False)[:limit]:
        location = ".".join([prefix, *(str(part) for part in error["loc"])])
        parts.append(f"{location}: {error['msg']}")
    if exc.error_count() > limit:
        parts.append(f"and {exc.error_count() - limit} more")
    return "; ".join(parts)


@dataclass(frozen=True)
class MetadataFormat:
    """A registry of body versions 1..N plus the codec of version N.

    ``encode`` maps a record to a version N body, ``decode`` maps a version N body back.
    """

    versions: tuple[BodyVersion, ...]
    encode: Callable[[CheckpointRecord], BaseModel]
    decode: Callable[[Any], CheckpointRecord]

    def __post_init__(self) -> None:
        if not self.versions:
            raise ValueError("a metadata format needs at least one version")
        for position, spec in enumerate(self.versions, start=1):
            if spec.version != position:
                raise ValueError(
                    f"metadata format versions must be 1, 2, 3, ... in order; position "
                    f"{position} holds version {spec.version}"
                )
            if position == 1 and spec.upgrade_from_previous is not None:
                raise ValueError("metadata format version 1 has no previous version to upgrade")
            if position > 1 and spec.upgrade_from_previous is None:
                raise ValueError(
                    f"metadata format version {position} needs an upgrade function from "
                    f"version {position - 1}"
                )

    @property
    def oldest_version(self) -> int:
        """The oldest version this format reads."""
        return self.versions[0].version

    @property
    def current_version(self) -> int:
        """The version this format writes."""
        return self.versions[-1].version

    def extended(
        self,
        version: BodyVersion,
        *,
        encode: Callable[[CheckpointRecord], BaseModel],
        decode: Callable[[Any], CheckpointRecord],
    ) -> MetadataFormat:
        """A new format that also reads (and now writes) ``version``; this one is unchanged."""
        return MetadataFormat(versions=(*self.versions, version), encode=encode, decode=decode)

    def dump(self, record: CheckpointRecord) -> bytes:
        """Serialize a record in the current version; MetadataError if it has no JSON form."""
        current = self.versions[-1]
        try:
            body = self.encode(record)
        except ValidationError as exc:
            raise MetadataError(
                f"cannot write checkpoint {record.checkpoint_id} of pipeline "
                f"{record.pipeline_key!r} as metadata version {current.version}: "
                f"{describe_validation_error(exc)}"
            ) from None
        if not isinstance(body, current.schema):
            raise TypeError(
                f"encode returned {type(body).__name__}, expected {current.schema.__name__}"
            )
        return seal(current.version, body.model_dump(mode="json"), indent=current.indent)

    def read_body(self, data: bytes, *, source: str) -> tuple[BaseModel, int]:
        """The body upgraded to the current version, and the version the file was written in."""
        if len(data) > MAX_METADATA_BYTES:
            raise MetadataError(
                f"checkpoint metadata {source} is {len(data)} bytes, more than the "
                f"{MAX_METADATA_BYTES} a _metadata file may have: refused unread (corrupt or "
                "not written by airflow-finalckpt)"
            )
        envelope = open_envelope(
            parse_json(data, source),
            source,
            oldest=self.oldest_version,
            newest=self.current_version,
        )
        written = self.versions[envelope.version - 1]
        try:
            body = written.schema.model_validate(envelope.body)
        except ValidationError as exc:
            raise MetadataError(
                f"checkpoint metadata {source} does not match the version {written.version} "
                f"schema: {describe_validation_error(exc)}"
            ) from None
        for step in self.versions[envelope.version :]:
            body = self._upgrade(body, step, source)
        return body, envelope.version

    @staticmethod
    def _upgrade(body: BaseModel, step: BodyVersion, source: str) -> BaseModel:
        assert step.upgrade_from_previous is not None  # checked in __post_init__
        try:
            upgraded = step.upgrade_from_previous(body)
        except (ValidationError, ValueError, TypeError) as exc:
            raise MetadataError(
                f"checkpoint metadata {source} cannot be upgraded from version "
                f"{step.version - 1} to {step.version}: {exc}"
            ) from None
        if not isinstance(upgraded, step.schema):
            raise TypeError(
                f"upgrade to version {step.version} returned {type(upgraded).__name__}, "
                f"expected {step.schema.__name__}"
            )
        return upgraded

    def load(self, data: bytes, *, source: str = "<bytes>") -> CheckpointRecord:
        """Read metadata of any supported version; every bad input raises MetadataError."""
        return self.load_versioned(data, source=source)[0]

    def load_versioned(
        self, data: bytes, *, source: str = "<bytes>"
    ) -> tuple[CheckpointRecord, int]:
        """As :meth:`load`, with the version the file was written in (one parse)."""
        body, version = self.read_body(data, source=source)
        try:
            return self.decode(body), version
        except MetadataError as exc:
            raise MetadataError(
                f"checkpoint metadata {source} (version {version}): {exc}"
            ) from None
        except (ValidationError, ValueError) as exc:
            raise MetadataError(
                f"checkpoint metadata {source} (version {version}) holds values this "
                f"airflow-finalckpt cannot represent: {exc}"
            ) from None
