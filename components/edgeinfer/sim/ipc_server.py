"""The Greengrass IPC server: event-stream RPC on a Unix socket, as the nucleus serves it.

Shapes are (de)serialized with the awsiotsdk's own model classes, so the JSON is exactly what
`GreengrassCoreIPCClientV2` sends and expects. The nucleus behaviour behind each operation lives in
`edgeinfer.sim.core.Nucleus`; this module does the wire: connect/auth, streams, replies, errors.
An operation of the model without a handler is answered with the modeled ServiceError the nucleus
sends ("Operation aws.greengrass#X is not supported by Greengrass"); one outside the model with an
error that carries no model type. A profile with an IPC message limit (nucleus lite: 10,000 bytes)
closes the component's whole connection, its subscriptions with it, on a larger message either way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from awsiot.greengrasscoreipc import model

from edgeinfer import codec
from edgeinfer.sim import eventstream as es
from edgeinfer.transport import _sdk_codec

if TYPE_CHECKING:
    from edgeinfer.sim.core import Nucleus

log = logging.getLogger(__name__)


def _operations() -> dict[str, Any]:
    ops: dict[str, Any] = {}
    for name in dir(model):
        obj: Any = getattr(model, name)
        if name.startswith("_") and name.endswith("Operation") and hasattr(obj, "_request_type"):
            with contextlib.suppress(NotImplementedError, AttributeError):
                ops[obj._model_name()] = obj
    return ops


OPERATIONS = _operations()


class ModeledError(Exception):
    """Raise with an awsiotsdk error shape (e.g. `model.UnauthorizedError(message=...)`)."""

    def __init__(self, shape: Any) -> None:
        super().__init__(getattr(shape, "message", ""))
        self.shape = shape


def unauthorized(message: str) -> ModeledError:
    return ModeledError(model.UnauthorizedError(message=message))


def invalid(message: str) -> ModeledError:
    return ModeledError(model.InvalidArgumentsError(message=message))


def not_found(
    message: str, resource_type: str | None = None, resource_name: str | None = None
) -> ModeledError:
    return ModeledError(
        model.ResourceNotFoundError(message=message, resource_type=resource_type, resource_name=resource_name)
    )


def service_error(message: str) -> ModeledError:
    return ModeledError(model.ServiceError(message=message))


@dataclass(eq=False)
class Stream:
    """An open operation stream that can carry events (a subscription)."""

    conn: Connection
    stream_id: int
    operation: str
    closed: bool = False
    on_close: list[Callable[[], None]] = field(default_factory=list)

    def send_event(self, shape: Any) -> None:
        """Send a stream event (loop thread only)."""
        self.send_raw(shape._model_name(), json.dumps(shape._to_payload()).encode())

    def send_raw(self, model_name: str, payload: bytes) -> None:
        if self.closed:
            return
        self.conn.send(self._event_headers(model_name), payload)

    def _event_headers(self, model_name: str) -> dict[str, Any]:
        return {
            ":message-type": es.APPLICATION_MESSAGE,
            ":message-flags": 0,
            ":stream-id": self.stream_id,
            ":content-type": "application/json",
            "service-model-type": model_name,
        }

    def event_frame(self, model_name: str, payload: bytes) -> bytes:
        """The frame `send_raw` writes, built on any thread (so that the loop only writes it)."""
        return es.encode(self._event_headers(model_name), payload)

    def send_frame_when_writable(self, frame: bytes, done: Callable[[], None]) -> None:
        """Write `frame` (from `event_frame`) after the frames queued before it, once the
        connection's write buffer is below its high-water mark; `done()` once it is written, or
        dropped because the stream or the connection closed. Loop thread only; in the common case
        (room in the buffer) it writes at once, with no task."""
        self.conn.write_when_writable(self, frame, done)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fn in self.on_close:
            try:
                fn()
            except Exception:
                log.exception("closing stream %s", self.operation)


Handler = Callable[["Connection", Any, "Stream"], Awaitable[Any]]
WRITE_BUFFER_HIGH = 4 * 1024 * 1024  # bytes an IPC connection buffers before events wait (see drain)
CONCURRENT_OPERATIONS = frozenset({"aws.greengrass#PublishToIoTCore", "aws.greengrass#SubscribeToIoTCore"})


class Connection:
    """One client connection: authenticates, then dispatches each new stream to the nucleus."""

    def __init__(self, server: IpcServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.nucleus = server.nucleus
        self.reader = reader
        self.writer = writer
        self.component: str | None = None
        self.streams: dict[int, Stream] = {}
        self.closed = False
        self._writable = asyncio.Lock()
        # Frames waiting for room in the write buffer, in order, and the task that writes them.
        self._pending: collections.deque[tuple[Stream, bytes, Callable[[], None]]] = collections.deque()
        self._flusher: asyncio.Task[None] | None = None
        # Room for a few dozen image-sized events: with asyncio's 64 KiB default every 80 KB event
        # waited for the client to read the one before, and a busy client's scheduling gaps became
        # the sender's (p50 0.1-0.5 s at 100 req/s on a loaded machine).
        with contextlib.suppress(AttributeError, RuntimeError):
            writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)

    def send(self, headers: dict[str, Any], payload: bytes = b"") -> None:
        if self.closed or self.writer.is_closing():
            return
        frame = es.encode(headers, payload)
        if not self._fits(frame):
            return
        self.writer.write(frame)

    def _fits(self, frame: bytes) -> bool:
        """Whether the nucleus can send `frame`; where it cannot, the connection is closed."""
        limit = self.nucleus.profile.ipc_max_message_bytes
        if limit is None or len(frame) <= limit:
            return True
        self.close_for_size(f"a {len(frame)}-byte message to it, over the {limit} bytes IPC carries")
        return False

    def close_for_size(self, why: str) -> None:
        """Close the whole connection (nucleus lite on a message over its IPC limit)."""
        log.warning("closing the IPC connection of %s: %s", self.component or "a client", why)
        comp = self.nucleus.components.get(self.component or "")
        if comp is not None:
            comp.log(f"IPC connection closed by the nucleus: {why}")
        with contextlib.suppress(Exception):
            self.writer.close()

    def has_room(self) -> bool:
        """The write buffer is below its high-water mark (a closed connection has room: nothing waits
        on it)."""
        if self.closed or self.writer.is_closing():
            return True
        return self.writer.transport.get_write_buffer_size() < WRITE_BUFFER_HIGH

    def write_when_writable(self, stream: Stream, frame: bytes, done: Callable[[], None]) -> None:
        """See `Stream.send_frame_when_writable`."""
        if self.closed or self.writer.is_closing() or not self._fits(frame):
            done()
            return
        if not self._pending and self.has_room():
            if not stream.closed:
                self.writer.write(frame)
            done()
            return
        self._pending.append((stream, frame, done))
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        try:
            while self._pending and not self.closed:
                await self.writable()
                while self._pending and not self.closed and not self.writer.is_closing() and self.has_room():
                    stream, frame, done = self._pending.popleft()
                    if not stream.closed:
                        self.writer.write(frame)
                    done()
                if self.writer.is_closing():
                    break
        finally:
            self._flusher = None
            self._drop_pending()

    def _drop_pending(self) -> None:
        while self._pending:
            _stream, _frame, done = self._pending.popleft()
            done()

    async def writable(self) -> None:
        """Wait until the write buffer is below its high-water mark, one waiter at a time (so the
        waiters, woken together, do not all write at once)."""
        async with self._writable:
            if self.closed or self.writer.is_closing():
                return
            with contextlib.suppress(ConnectionError):
                await self.writer.drain()

    async def serve(self) -> None:
        decoder = es.Decoder(max_frame=self.nucleus.profile.ipc_max_message_bytes)
        try:
            while True:
                data = await self.reader.read(1 << 20)  # a whole image request in one go
                if not data:
                    break
                for frame in decoder.feed(data):
                    await self._on_frame(frame)
        except es.FrameTooLargeError as exc:
            self.close_for_size(f"{exc} from it")
        except es.FrameError as exc:
            log.warning("IPC protocol error from %s: %s", self.component or "unauthenticated client", exc)
            self.send(
                {":message-type": es.PROTOCOL_ERROR, ":message-flags": 0, ":stream-id": 0},
                json.dumps({"message": str(exc)}).encode(),
            )
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed = True
            self._drop_pending()
            for stream in list(self.streams.values()):
                stream.close()
            self.streams.clear()
            self.server.connections.discard(self)
            with contextlib.suppress(Exception):
                self.writer.close()

    async def _on_frame(self, frame: es.Frame) -> None:
        mtype = frame.message_type
        if mtype == es.PING:
            self.send(
                {":message-type": es.PING_RESPONSE, ":message-flags": 0, ":stream-id": 0}, frame.payload
            )
            return
        if mtype == es.CONNECT:
            self._on_connect(frame)
            return
        if mtype == es.PING_RESPONSE:
            return
        if self.component is None:
            # Anything before an accepted CONNECT is a protocol error; the client will hang up.
            self.send(
                {":message-type": es.PROTOCOL_ERROR, ":message-flags": 0, ":stream-id": 0},
                b'{"message": "connection not authenticated"}',
            )
            return
        if mtype not in (es.APPLICATION_MESSAGE, es.APPLICATION_ERROR):
            return
        sid = frame.stream_id
        stream = self.streams.get(sid)
        if stream is not None:
            if frame.flags & es.FLAG_TERMINATE_STREAM:
                del self.streams[sid]
                stream.close()
            return
        operation = frame.headers.get("operation")
        if not isinstance(operation, str):
            return  # a message for a stream already closed on our side
        await self._on_operation(sid, operation, frame)

    def _on_connect(self, frame: es.Frame) -> None:
        token = None
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            token = json.loads(frame.payload.decode() or "{}").get("authToken")
        version_ok = frame.headers.get(":version") == "0.1.0"
        component = self.nucleus.component_for_token(token) if version_ok and token else None
        if component is None:
            log.warning("IPC connect refused: %s", "bad :version" if not version_ok else "unknown auth token")
            # The nucleus answers without the accepted flag and lets the client hang up first.
            self.send({":message-type": es.CONNECT_ACK, ":message-flags": 0, ":stream-id": 0})
            return
        self.component = component
        self.send(
            {":message-type": es.CONNECT_ACK, ":message-flags": es.FLAG_CONNECTION_ACCEPTED, ":stream-id": 0}
        )
        log.debug("IPC client connected as %s", component)

    def _reply_error(self, sid: int, shape: Any) -> None:
        if shape._model_name().partition("#")[2] in self.nucleus.profile.empty_error_messages:
            shape.message = ""  # nucleus lite sends these without a text
        self.send(
            {
                ":message-type": es.APPLICATION_ERROR,
                ":message-flags": es.FLAG_TERMINATE_STREAM,
                ":stream-id": sid,
                ":content-type": "application/json",
                "service-model-type": shape._model_name(),
            },
            json.dumps(shape._to_payload()).encode(),
        )

    def _reply_unsupported(self, sid: int, operation: str) -> None:
        # What the nucleus's event-stream server sends for an operation that is not in its model:
        # an error without a service-model-type (the Python client sees the stream close).
        payload = json.dumps(
            {"error": "Unsupported Operation", "message": f"{operation} is an unsupported operation."}
        )
        self.send(
            {
                ":message-type": es.APPLICATION_ERROR,
                ":message-flags": es.FLAG_TERMINATE_STREAM,
                ":stream-id": sid,
                ":content-type": "application/json",
            },
            payload.encode(),
        )

    async def _on_operation(self, sid: int, operation: str, frame: es.Frame) -> None:
        op_type = OPERATIONS.get(operation)
        if op_type is None:
            self._reply_unsupported(sid, operation)
            return
        handler = self.nucleus.ipc_handlers.get(operation)
        if handler is None:
            # The nucleus registers a handler for every operation of its model; those it does not
            # implement answer with this modeled error (classic's UnsupportedOperationHandler;
            # nucleus lite's carries no message).
            message = f"Operation {operation} is not supported by Greengrass"
            if not self.nucleus.profile.refused_operations_say_why:
                message = ""
            self._reply_error(sid, model.ServiceError(message=message))
            return
        try:
            body = codec.loads(frame.payload) if frame.payload else {}
            request = op_type._request_type()._from_payload(body)
        except Exception as exc:
            self._reply_error(
                sid, model.InvalidArgumentsError(message=f"cannot read {operation} request: {exc}")
            )
            return
        streaming = op_type._response_stream_type() is not None
        stream = Stream(self, sid, operation)
        if streaming:
            self.streams[sid] = stream
        if operation in CONCURRENT_OPERATIONS:
            # These wait on the broker: answer them when done, without holding up the next request.
            task = asyncio.create_task(self._complete(op_type, handler, request, stream, streaming))
            self.server.tasks.add(task)
            task.add_done_callback(self.server.tasks.discard)
        else:
            await self._complete(op_type, handler, request, stream, streaming)

    async def _complete(
        self, op_type: Any, handler: Handler, request: Any, stream: Stream, streaming: bool
    ) -> None:
        sid, operation = stream.stream_id, stream.operation
        try:
            response = await handler(self, request, stream)
        except ModeledError as exc:
            self.streams.pop(sid, None)
            stream.close()
            self._reply_error(sid, exc.shape)
            return
        except Exception as exc:
            log.exception("IPC %s failed", operation)
            self.streams.pop(sid, None)
            stream.close()
            self._reply_error(sid, model.ServiceError(message=f"{operation} failed: {exc}"))
            return
        if response is None:
            response = op_type._response_type()()
        self.send(
            {
                ":message-type": es.APPLICATION_MESSAGE,
                ":message-flags": 0 if streaming else es.FLAG_TERMINATE_STREAM,
                ":stream-id": sid,
                ":content-type": "application/json",
                "service-model-type": response._model_name(),
            },
            json.dumps(response._to_payload()).encode(),
        )


class IpcServer:
    def __init__(self, nucleus: Nucleus, path: str) -> None:
        self.nucleus = nucleus
        self.path = path
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        _sdk_codec.install()  # the model classes decode every request's binary payload
        self._server = await asyncio.start_unix_server(self._accept, path=self.path, limit=2**20)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self, reader, writer)
        self.connections.add(conn)
        await conn.serve()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            with contextlib.suppress(Exception):
                conn.writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
