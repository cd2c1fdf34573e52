"""Typed errors, shared by broker, clients, stores and transports.

Every error the broker can send back has a stable `code` (a short string carried in the error
frame's header, see docs/protocol.md); the client turns the code back into the same class, so a
caller catches `TopicNotFoundError` whether it came from this process or over the wire.
"""

from __future__ import annotations


class EQueueError(Exception):
    """Base of every error this project raises on purpose."""

    code = "error"

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        self.details = details

    def wire_details(self, max_str: int | None = None) -> dict[str, object]:
        """The details an error answer carries (docs/protocol.md, "Error frames"): those whose
        value is an int (a bool counts), a float or a str (of at most `max_str` characters);
        any other is left out, never sent as its string."""
        return {k: v for k, v in self.details.items()
                if isinstance(v, (int, float)) or (isinstance(v, str) and (max_str is None or len(v) <= max_str))}


class ConfigError(EQueueError):
    """Invalid configuration."""

    code = "config"


class PluginError(EQueueError):
    """A plugin is missing, unknown or does not implement its contract."""

    code = "plugin"


class ProtocolError(EQueueError):
    """A frame or header that does not parse."""

    code = "protocol"


class FrameTooLargeError(ProtocolError):
    """A frame larger than the maximum frame size."""

    code = "frame_too_large"


class InvalidMessageError(EQueueError):
    """A message the broker refuses (bad field, too large, bad batch layout)."""

    code = "invalid_message"


class MessageTooLargeError(InvalidMessageError):
    """A message body over the maximum body size."""

    code = "message_too_large"


class DelayTooLongError(InvalidMessageError):
    """A deliver-at time further away than the broker's max_deliver_delay."""

    code = "delay_too_long"


class InvalidTopicError(EQueueError):
    """A topic name that is not 1-127 chars of [A-Za-z0-9_.%-], or a reserved one."""

    code = "invalid_topic"


class SystemTopicError(InvalidTopicError):
    """A producer or admin request naming a system topic (%RETRY%, %DLQ%, %SCHEDULE%, ...)."""

    code = "system_topic"


class TopicNotFoundError(EQueueError):
    """The topic does not exist (and auto-creation is off, or this was a pull)."""

    code = "topic_not_found"


class QueueNotFoundError(EQueueError):
    """The queue id is not one of the topic's queues."""

    code = "queue_not_found"


class OffsetOutOfRangeError(EQueueError):
    """A queue offset below the queue's minimum (deleted) or above its maximum."""

    code = "offset_out_of_range"

    @property
    def min_offset(self) -> int:
        return int(self.details.get("min_offset", 0))  # type: ignore[arg-type]

    @property
    def max_offset(self) -> int:
        return int(self.details.get("max_offset", 0))  # type: ignore[arg-type]


class MessageNotFoundError(EQueueError):
    """No message at that id/position."""

    code = "message_not_found"


class CorruptRecordError(EQueueError):
    """A stored record whose length, magic or crc is wrong. Raised by a store instead of serving
    it; details name it: topic, queue_id, offset (queue offset), position (store position)."""

    code = "corrupt_record"

    @property
    def offset(self) -> int | None:
        v = self.details.get("offset")
        return int(v) if isinstance(v, int) else None  # type: ignore[arg-type]


class StoreError(EQueueError):
    """The store failed (disk full, closed, I/O error)."""

    code = "store"


class StoreLockedError(StoreError):
    """Another writer (a broker, in this process or another) holds the data directory."""

    code = "store_locked"


class InvalidOffsetError(EQueueError):
    """A committed offset the broker cannot keep: a bad group, topic or queue id, or an offset
    outside 0..2**63-1. Nothing of the request that carried it was committed."""

    code = "invalid_offset"


class TransportError(EQueueError):
    """The connection failed or was lost."""

    code = "transport"


class TlsRequiredError(TransportError):
    """A plaintext client reached a TLS port: the server answers this and closes."""

    code = "tls_required"


class HandshakeRefusedError(TransportError):
    """(client side, not sent) the server refused the connection's handshake: a CURVE key it does
    not allow, a wrong server key, or a CURVE server reached without CURVE (or the reverse)."""

    code = "handshake_refused"


class ConnectionLostError(TransportError):
    """The connection closed while a request was in flight."""

    code = "connection_lost"


class RequestTimeoutError(TransportError):
    """No response within the request timeout."""

    code = "timeout"


class UnknownRequestError(ProtocolError):
    """The broker does not know this request code."""

    code = "unknown_request"


class TooManyConnectionsError(TransportError):
    """The broker refused the connection: it has as many as `max_connections` allows."""

    code = "too_many_connections"


class BrokerBusyError(EQueueError):
    """The broker refused the request under load; retry later."""

    code = "busy"


class ClientClosedError(EQueueError):
    """The client was closed."""

    code = "closed"


class BrokerNameConflictError(EQueueError):
    """A name server refused a registration: a live broker of the same cluster already has the name."""

    code = "broker_name_conflict"


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def error_for_code(code: str) -> type[EQueueError]:
    """The error class for a wire error code (EQueueError if unknown)."""
    for cls in _all_subclasses(EQueueError):
        if cls.code == code:
            return cls
    return EQueueError


class AccessDeniedError(EQueueError):
    """The broker's authorizer refused the request (unsigned, bad signature, replay, no right)."""

    code = "access_denied"


class NotMasterError(EQueueError):
    """A write reached a broker that is a replica (detail `master`: the master's address, if known)."""

    code = "not_master"


class NotEnoughReplicasError(EQueueError):
    """A sync-replicated send found fewer in-sync replicas than min_insync, or they did not
    acknowledge in time (details `in_sync`, `min_insync`)."""

    code = "not_enough_replicas"


class ReplicaRefusedError(EQueueError):
    """A master refused a replica: another broker group, or an epoch ahead of the master's."""

    code = "replica_refused"


class NoControllerError(EQueueError):
    """The name server runs no controller (it was started without --controller-peers)."""

    code = "no_controller"


class NotLeaderError(EQueueError):
    """This name server's controller is not the Raft leader; the `leader` detail names the one it
    believes is (empty while an election runs). Ask another name server."""

    code = "not_leader"


class NoQuorumError(EQueueError):
    """The controller could not commit a decision: no majority of its Raft peers answers."""

    code = "no_quorum"


class FailoverRefusedError(EQueueError):
    """A master election was refused: unknown group, or the chosen broker is not a live member of
    the group's in-sync set (electing it could lose acknowledged messages)."""

    code = "failover_refused"
