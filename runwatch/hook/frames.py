"""Messages on a pipe between the training process and runwatch's process beside it
(``runwatch.live_process``): each is its length, then its pickle."""

from __future__ import annotations

import io
import os
import pickle
import struct
from typing import Any

_HEADER = struct.Struct("<I")


def frame(message: Any, pickler: type[pickle.Pickler] = pickle.Pickler) -> bytes:
    """One message on a pipe: its length, then its pickle, written once (``pickler``: one
    that reduces some objects its own way)."""
    out = io.BytesIO()
    out.write(bytes(_HEADER.size))
    pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    view = out.getbuffer()
    _HEADER.pack_into(view, 0, len(view) - _HEADER.size)
    del view  # getvalue() needs the buffer released
    return out.getvalue()


class FrameReader:
    """Messages from a file descriptor, as :func:`frame` wrote them."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def read(self) -> list[Any] | None:
        """The messages that one ``os.read`` completes; None at the end of the pipe."""
        chunk = os.read(self._fd, 1 << 20)
        if not chunk:
            return None
        self._buffer += chunk
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            messages.append(pickle.loads(self._buffer[_HEADER.size : end]))
            del self._buffer[:end]
        return messages
