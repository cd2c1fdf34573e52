"""One writer per data directory, whatever the store: a second writer, in another process or in
this one, is refused with StoreLockedError naming the directory and the holder's pid; readers
are not; and a writer killed with SIGKILL leaves no lock behind."""

from __future__ import annotations

import pytest

from equeue_core.errors import StoreLockedError

from .kit import Child, check_message, open_store, read_all

T = "locked"


def _start_writer(harness, count: int) -> tuple[Child, int]:
    child = Child.start("_writer.py", harness.name, harness.data_dir, T, str(count))
    assert child.read_until(lambda lines: any(x.startswith(("writing", "refused")) for x in lines), timeout=60), \
        child.drain(5)
    assert child.lines[-1].startswith("writing"), child.lines
    return child, int(child.lines[-1].split()[1])


def test_second_writer_process_is_refused_while_readers_read(harness):
    holder, pid = _start_writer(harness, 25)
    try:
        second = Child.start("_writer.py", harness.name, harness.data_dir, T, "5")
        err = second.drain(timeout=60)
        assert second.proc.returncode == 3, f"a second writer process opened the store: {second.lines} {err}"
        assert second.lines[-1].startswith("refused StoreLockedError"), second.lines
        assert str(pid) in second.lines[-1] and harness.data_dir in second.lines[-1]

        with pytest.raises(StoreLockedError, match=str(pid)):  # and from this process too
            open_store(harness.name, harness.data_dir)

        reader = harness.reader()  # readers need no lock
        assert reader.queue_range(T, 0) == (0, 25)
        rows = sum(batch.num_rows for batch in reader.export(T, 0, 0, 25))
        assert rows == 25
        reader.close()  # LMDB: a process cannot open for writing what it has open read-only
    finally:
        holder.drain(timeout=60)  # closes its stdin: it closes the engine and exits
        holder.stop()
    assert holder.lines[-1] == "closed"
    h = harness.open()  # the holder closed: the directory is writable again, its records intact
    assert h.store.queue_range(T, 0) == (0, 25)


def test_writer_in_this_process_refuses_a_second_one_until_it_closes(harness):
    h = harness.open()
    with pytest.raises(StoreLockedError, match="open for writing"):
        open_store(harness.name, harness.data_dir)
    h.close()
    harness.open().close()


@pytest.mark.failure
def test_lock_of_a_writer_killed_with_sigkill_is_gone(harness):
    holder, _pid = _start_writer(harness, 10)
    holder.stop()  # SIGKILL
    holder.drain(timeout=10)
    h = harness.open()
    assert h.store.queue_range(T, 0) == (0, 10)
    for i, msg in enumerate(read_all(h.store, T, 0, 0, 10)):
        check_message(msg, T, 0, i)
