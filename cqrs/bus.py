"""CommandBus: send commands to the commands topic, routed by aggregate id, and get their results.

How a result gets back: each bus owns a reply topic (`<commands topic>-reply-<random id>`, one
queue, created at start and deleted at close) and consumes it with a group of the same name. A
command goes out with a `reply_to` property naming that topic; the processor sends the command's
CommandResult there once the command's events are persisted and published (the results of one
consumed batch of commands travel together, as one message holding a list). `submit` returns a
future of that result, `send` waits for it, `send_async` only waits for nothing (fire and forget:
no reply is asked for). A bus that dies loses only its replies: the commands are handled anyway.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import uuid
from typing import Any

from equeue_cqrs.errors import CommandFailedError, CommandTimeoutError
from equeue_cqrs.messages import Command, CommandResult, decode_results, encode, type_name
from equeue_cqrs.processor import REPLY_TO
from equeue_cqrs.topics import ensure_topics

from equeue_core.client import AdminClient, Consumer, Message, Producer, ReceivedMessage
from equeue_core.errors import EQueueError

log = logging.getLogger("equeue.cqrs")


class CommandBus:
    def __init__(self, broker: str, commands_topic: str = "commands", *, timeout: float = 60.0,
                 producer_options: dict[str, Any] | None = None) -> None:
        self.broker = broker
        self.commands_topic = commands_topic
        self.timeout = timeout
        self.reply_topic = f"{commands_topic}-reply-{uuid.uuid4().hex[:12]}"
        self.producer = Producer(broker, **(producer_options or {}))
        self._consumer: Consumer | None = None
        self._waiting: dict[str, concurrent.futures.Future] = {}
        self._lock = threading.Lock()

    def start(self) -> CommandBus:
        self.producer.start()
        ensure_topics(self.broker, {self.commands_topic: None, self.reply_topic: 1})
        self._consumer = Consumer(self.reply_topic, self.broker, consume_from="first", consume_batch_size=64,
                                  pull_batch=64, parallel_per_queue=4)
        self._consumer.subscribe(self.reply_topic).start(self._on_replies)
        return self

    def _message(self, command: Command, reply: bool) -> Message:
        return Message(self.commands_topic, encode(command), tag=type_name(command), keys=(command.command_id,),
                       properties={REPLY_TO: self.reply_topic} if reply else None)

    def submit(self, command: Command) -> concurrent.futures.Future:
        """Send; the future resolves to the CommandResult once the events are persisted."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._waiting[command.command_id] = future
        try:
            self.producer.send_async(self._message(command, True), routing_key=command.aggregate_id)
        except Exception:
            with self._lock:
                self._waiting.pop(command.command_id, None)
            raise
        return future

    def send(self, command: Command, timeout: float | None = None) -> CommandResult:
        """Send and wait until the command's events are persisted; a failed command raises
        CommandFailedError, no result in time CommandTimeoutError (it may still be handled)."""
        future = self.submit(command)
        try:
            result = future.result(timeout or self.timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._waiting.pop(command.command_id, None)
            raise CommandTimeoutError(f"no result for {type_name(command)} {command.command_id} "
                                      f"within {timeout or self.timeout:.0f}s") from None
        if not result.ok:
            raise CommandFailedError(result.message, result=result)
        return result

    def send_async(self, command: Command) -> Any:
        """Send without asking for the result; returns the producer's future of the SendResult."""
        return self.producer.send_async(self._message(command, False), routing_key=command.aggregate_id)

    def _on_replies(self, msgs: list[ReceivedMessage]) -> None:
        for m in msgs:
            for result in decode_results(m.body):
                with self._lock:
                    future = self._waiting.pop(result.command_id, None)
                if future is not None and not future.done():
                    future.set_result(result)

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        """Stop consuming replies, delete the reply topic (best effort), close the producer.
        Futures of results that never came stay unresolved: wait on them with a timeout."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
            try:
                with AdminClient(self.broker) as admin:
                    admin.delete_topic(self.reply_topic)
            except EQueueError as e:
                log.warning("reply topic %s not deleted: %s", self.reply_topic, e)
        self.producer.close()

    def __enter__(self) -> CommandBus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
