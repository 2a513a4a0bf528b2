"""kombu's filesystem:// transport (the embedded default's Celery broker, no server) with
messages written atomically: kombu creates the message file and then writes it, so a
worker that lists the folder in between moves an empty file and dies on
"JSONDecodeError: Expecting value" (celery/kombu#1551). Here a message is written under a
name no reader takes (`.…part`: it does not end in `.<queue>.msg`) and renamed into place,
which a reader sees whole or not at all (POSIX rename). Settings use it for filesystem://
brokers (CELERY_BROKER_TRANSPORT)."""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put `payload` onto `queue`: written whole, then renamed to its message name."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        part = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(part, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(part, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
