"""The embedded default's broker: kombu's filesystem transport, with a message file
written whole before a worker can see it.

Kombu 5.7's filesystem transport creates a message's file under its final name and
then writes it; a worker polling the folder can move the file away and read it in
between, find it empty, and die on the JSON (celery/kombu#1551, open). It happened
here: ``make run``'s worker exited with ``JSONDecodeError`` and honcho took the
console down with it. A message is written under a name the reader skips
(``….msg.tmp``: it reads only names ending ``.<queue>.msg``) and renamed into place
when complete; a rename within a folder is atomic, so a reader sees the whole file
or nothing. Everything else is kombu's (settings.py names this transport).
"""

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
        """Put a message onto ``queue``: kombu's file name (its millisecond prefix
        keeps the queue in order), written in full first."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        path = os.path.join(self.data_folder_out, name)
        partial = path + ".tmp"
        try:
            with open(partial, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(partial, path)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {path!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
