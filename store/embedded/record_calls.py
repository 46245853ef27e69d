"""The embedded engine's records (sessions, offsets, retained messages, wills, bans): `Store` calls answered by the
RocksDB metadata store (`store.embedded.meta.store`), off the heap. Each write is unsynced until the engine's next
group-commit round, which fsyncs the metadata WAL with the log (`MetaStore.sync_work`)."""

from __future__ import annotations

from collections.abc import Sequence

from tidewire.store.base import SHARED_PREFIX, Ban, Message, SessionRecord, WillRecord
from tidewire.store.embedded.meta.store import MetaStore


class RecordCalls:
    """Mixed into `EmbeddedStore`: `_meta` is set by its `open()`; `_write_gen` counts writes for `sync()`."""

    _meta: MetaStore
    _write_gen: int

    # --- sessions and offsets -------------------------------------------------------------------------------
    async def get_session(self, client_id: str) -> SessionRecord | None:
        return self._meta.get_session(client_id)

    def session_absent(self, client_id: str) -> bool:
        return self._meta.get_session(client_id) is None  # one RocksDB read, no waiting

    async def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        claimed = self._meta.claim_session(client_id, owner)
        self._write_gen += 1
        return claimed

    async def put_session(self, record: SessionRecord) -> bool:
        if not self._meta.put_session(record):
            return False
        self._write_gen += 1
        return True

    async def delete_session(self, client_id: str, epoch: int = -1) -> None:
        self._meta.delete_session(client_id, epoch)
        self._write_gen += 1

    async def list_sessions(self) -> list[SessionRecord]:
        return [record for batch in self._meta.iter_sessions() for record in batch]

    async def set_offsets(self, offsets: dict[str, tuple[int, int, int]]) -> None:
        if offsets:
            self._meta.set_offsets(offsets)
            self._write_gen += 1

    async def online_sessions(self) -> list[str]:
        return [c for c in self._meta.online_sessions() if not c.startswith(SHARED_PREFIX)]

    async def due_sessions(self, now_ms: int, limit: int) -> list[str]:
        return self._meta.due_sessions(now_ms, limit)

    async def session_count(self) -> int:
        return self._meta.counts().get("sessions", 0)

    async def subscription_filters(self) -> dict[str, int]:
        return self._meta.subscription_filters()

    async def shared_members(self, group_key: str) -> list[str]:
        return self._meta.shared_members(group_key)

    async def subscribed(self, filters: Sequence[str]) -> bool:
        return self._meta.subscribed(filters)

    # --- retained -------------------------------------------------------------------------------------------
    async def set_retained(self, topic: str, message: Message | None) -> None:
        self._meta.set_retained(topic, message)
        self._write_gen += 1

    async def retained_usage(self) -> tuple[int, int]:
        return self._meta.retained_usage()

    async def match_retained(self, topic_filter: str, after: str | None = None, limit: int = 0,
                             max_bytes: int = 0) -> list[Message]:
        return self._meta.match_retained(topic_filter, limit, after, max_bytes)

    # --- wills ----------------------------------------------------------------------------------------------
    async def put_will(self, will: WillRecord) -> None:
        self._meta.put_will(will)
        self._write_gen += 1

    async def delete_will(self, client_id: str) -> None:
        self._meta.delete_will(client_id)
        self._write_gen += 1

    async def list_wills(self) -> list[WillRecord]:
        return self._meta.list_wills()

    # --- bans -----------------------------------------------------------------------------------------------
    async def get_bans(self) -> list[Ban]:
        return self._meta.list_bans()

    async def put_ban(self, ban: Ban) -> None:
        self._meta.put_ban(ban)
        self._write_gen += 1

    async def delete_ban(self, kind: str, who: str, expired_before: float | None = None) -> bool:
        if not self._meta.delete_ban(kind, who, expired_before):
            return False
        self._write_gen += 1
        return True

    # --- versioned documents (one process owns the data directory: a read and a write never interleave) -------
    async def get_document(self, name: str) -> tuple[int, bytes]:
        return self._meta.get_document(name)

    async def put_document(self, name: str, value: bytes, expected: int) -> int:
        version = self._meta.put_document(name, value, expected)
        if version:
            self._write_gen += 1
        return version
