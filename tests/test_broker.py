"""The embedded default's broker (startsafe/broker.py): a worker never reads a message
file that is not yet written whole. Kombu's own filesystem transport creates the file,
then writes it; a worker that moved and read it in between died on the empty JSON
(make run's worker did, in a fresh clone)."""

from __future__ import annotations

import multiprocessing
import time
from contextlib import suppress
from pathlib import Path
from queue import Empty

from django.conf import settings
from kombu import Connection

from startsafe import broker

TRANSPORT = "startsafe.broker:Transport"


def _connection(folder: Path) -> Connection:
    options = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(folder),
        "store_processed": False,
    }
    return Connection("filesystem://", transport=TRANSPORT, transport_options=options)


def test_the_embedded_default_uses_it():
    if settings.CELERY_BROKER_URL == "filesystem://":
        assert settings.CELERY_BROKER_TRANSPORT == TRANSPORT


def test_no_file_a_worker_reads_exists_while_the_message_is_written(tmp_path, monkeypatch):
    """While the message is serialized and written, the folder holds no file under a
    name the reader takes (``*.<queue>.msg``); after, exactly one, read whole."""
    visible_while_writing = []
    real_dumps = broker.dumps

    def dumps_and_look(payload):
        visible_while_writing.extend(p.name for p in tmp_path.glob("*.jobs.msg"))
        return real_dumps(payload)

    monkeypatch.setattr(broker, "dumps", dumps_and_look)
    with _connection(tmp_path) as connection:
        channel = connection.channel()
        channel._put("jobs", {"n": 1})

        assert visible_while_writing == []
        assert [p.suffix for p in tmp_path.iterdir()] == [".msg"]
        assert channel._get("jobs") == {"n": 1}
        assert list(tmp_path.iterdir()) == []


def _produce(folder: str, count: int) -> None:
    with _connection(Path(folder)) as connection:
        channel = connection.channel()
        for n in range(count):
            channel._put("jobs", {"n": n, "body": "x" * 20_000})


def test_a_worker_polling_beside_a_producer_reads_every_message_whole(tmp_path):
    """Two processes, as make run's web server (or beat) and worker are: every message
    arrives once, none empty. (Kombu's own transport lost 7 to 56 of 3,000 to
    empty reads in four runs of five on this machine.)"""
    count = 2_000
    producer = multiprocessing.get_context("spawn").Process(
        target=_produce, args=(str(tmp_path), count)
    )
    producer.start()
    received = []
    with _connection(tmp_path) as connection:
        channel = connection.channel()
        deadline = time.monotonic() + 60
        while len(received) < count and time.monotonic() < deadline:
            with suppress(Empty):  # nothing there yet
                received.append(channel._get("jobs")["n"])
    producer.join(30)
    assert sorted(received) == list(range(count))  # each once (same-millisecond ones unordered)
