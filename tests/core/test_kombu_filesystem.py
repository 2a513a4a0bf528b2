"""The embedded default's Celery broker (core/kombu_filesystem.py): a message is seen whole
or not at all, so a worker polling the folder while another process writes never reads a
half-written file (kombu's own filesystem transport let it die on a JSONDecodeError)."""

from __future__ import annotations

import threading

from kombu import Connection, Queue

from core.kombu_filesystem import Transport


def _connection(folder):
    return Connection(transport=Transport, transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder),
        "processed_folder": str(folder / "processed"), "control_folder": str(folder / "c")})


def test_a_reader_polling_while_a_writer_writes_gets_every_message_whole(tmp_path):
    (tmp_path / "processed").mkdir()
    sent, got, errors = 400, [], []
    big = "x" * 200_000  # a large body makes a half-written file likely with plain kombu
    queue = Queue("q")

    def write():
        with _connection(tmp_path) as conn:
            producer = conn.Producer()
            for n in range(sent):
                producer.publish({"n": n, "pad": big}, routing_key="q", declare=[queue])

    writer = threading.Thread(target=write)
    with _connection(tmp_path) as conn:
        simple = conn.SimpleQueue(queue)
        writer.start()
        while len(got) < sent:
            try:
                message = simple.get(timeout=10)
            except simple.Empty:
                break
            except ValueError as exc:  # JSONDecodeError: a file read before it was whole
                errors.append(exc)
                continue
            got.append(message.payload["n"])
            message.ack()
        simple.close()
    writer.join()
    assert errors == []
    assert sorted(got) == list(range(sent))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_settings_use_it_for_a_filesystem_broker():
    from django.conf import settings
    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        assert settings.CELERY_BROKER_TRANSPORT == "core.kombu_filesystem:Transport"
    else:  # (Redis in CI): the setting is only for the embedded default
        assert not getattr(settings, "CELERY_BROKER_TRANSPORT", None)


def test_a_message_still_being_written_is_never_taken(tmp_path):
    (tmp_path / "processed").mkdir()
    # what the writer holds while it writes: a part file, half of a JSON body
    (tmp_path / ".1_abc.q.msg.part").write_bytes(b'{"body": "eyJu')
    with _connection(tmp_path) as conn:
        simple = conn.SimpleQueue(Queue("q"))
        try:
            simple.get(timeout=0.5)
            raise AssertionError("a part file was taken as a message")
        except simple.Empty:
            pass
        finally:
            simple.close()
    assert (tmp_path / ".1_abc.q.msg.part").exists()
