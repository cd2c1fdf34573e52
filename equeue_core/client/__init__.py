"""Client API: `from equeue_core.client import Producer, Consumer, LitePullConsumer, Message`."""

from equeue_core.client.admin import AdminClient, AsyncAdminClient
from equeue_core.client.consumer import AsyncConsumer, Consumer
from equeue_core.client.lite_pull import LitePullConsumer
from equeue_core.client.message import Message, ReceivedMessage, SendResult
from equeue_core.client.producer import AsyncProducer, Producer

__all__ = ["AdminClient", "AsyncAdminClient", "AsyncConsumer", "AsyncProducer", "Consumer",
           "LitePullConsumer", "Message", "Producer", "ReceivedMessage", "SendResult"]
