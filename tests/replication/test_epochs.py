"""The epoch file and the divergence point computed from two brokers' epoch lists."""

from __future__ import annotations

import pytest

from equeue_core.errors import StoreError
from equeue_core.replication.epochs import EpochFile, divergence_point


def test_epoch_file_survives_a_reopen_and_refuses_older_epochs(tmp_path):
    f = EpochFile(str(tmp_path))
    f.begin(1, 0)
    f.begin(3, 500)
    f.begin(3, 700)  # same epoch again: nothing new
    assert EpochFile(str(tmp_path)).entries == [(1, 0), (3, 500)]
    with pytest.raises(StoreError, match="older"):
        f.begin(2, 900)
    with pytest.raises(StoreError, match="before"):
        f.begin(4, 100)
    f.truncate(500)
    assert EpochFile(str(tmp_path)).entries == [(1, 0)]


def test_a_damaged_epoch_file_is_refused_with_a_clear_error(tmp_path):
    f = EpochFile(str(tmp_path))
    f.begin(1, 0)
    data = bytearray((tmp_path / "epochs").read_bytes())
    data[10] ^= 0xFF
    (tmp_path / "epochs").write_bytes(bytes(data))
    with pytest.raises(StoreError, match="damaged"):
        EpochFile(str(tmp_path))


@pytest.mark.parametrize(("mine", "my_end", "theirs", "their_end", "cut"), [
    # the old master of epoch 1 stored 0..100; its replica had 80 when promoted to epoch 2
    ([(1, 0)], 100, [(1, 0), (2, 80)], 150, 80),
    # a static master (no epoch yet) rejoins a replica promoted at 80
    ([], 100, [(1, 80)], 150, 80),
    # the replica is only behind: nothing to cut
    ([(1, 0)], 60, [(1, 0), (2, 80)], 150, 60),
    # I was master of epoch 2 from 80 (to 90); they never saw epoch 2 and went on with epoch 1
    # to 100, then epoch 3: my epoch-2 records are not theirs, the logs agree up to 80
    ([(1, 0), (2, 80)], 90, [(1, 0), (3, 100)], 120, 80),
    # same history
    ([(1, 0), (2, 80)], 150, [(1, 0), (2, 80)], 150, 150),
    # no epoch in common: copy everything again
    ([(5, 0)], 50, [(6, 0)], 70, 0),
])
def test_divergence_point_is_where_the_last_common_epoch_ends(mine, my_end, theirs, their_end, cut):
    assert divergence_point(mine, my_end, theirs, their_end) == cut
