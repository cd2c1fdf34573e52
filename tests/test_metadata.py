"""Topic definitions and scheduler progress in the stores' metadata values (equeue_core/metadata.py),
and data directories written before scheduler progress had a part of its own."""

from __future__ import annotations

import base64
import json

from equeue_core.contracts import ScheduleQueueProgress, ScheduleState, StoreSettings
from equeue_core.plugins import get_plugin_manager


def _legacy_offsets_file(data_dir) -> None:
    """offsets.json as the broker wrote it before the store engine hook: the scheduler's next
    offsets as consumer offsets of group %SCHEDULE%, delivered offsets under schedule_delivered."""
    data_dir.mkdir(parents=True)
    meta = {"topics": b'{"%SCHEDULE%": 19, "orders": 4}', "schedule_delivered": b'{"0": [3, 7, 9], "18": [40]}'}
    doc = {"format": "equeue-offsets", "version": 1,
           "offsets": [["%SCHEDULE%", "%SCHEDULE%", 0, 5], ["%SCHEDULE%", "%SCHEDULE%", 18, 41],
                       ["billing", "orders", 2, 17]],
           "meta": {k: base64.b64encode(v).decode() for k, v in meta.items()}}
    (data_dir / "offsets.json").write_text(json.dumps(doc))


def test_scheduler_progress_of_an_older_data_dir_is_read_and_moved_on_save(tmp_path):
    data = tmp_path / "data"
    _legacy_offsets_file(data)
    engine = get_plugin_manager().store_engine("file")(StoreSettings(data_dir=str(data)))
    try:
        assert engine.topics.load() == {"%SCHEDULE%": 19, "orders": 4}
        progress = engine.schedule.load()
        assert progress == ScheduleState({("%SCHEDULE%", 0): ScheduleQueueProgress(5, frozenset({7, 9})),
                                          ("%SCHEDULE%", 18): ScheduleQueueProgress(41)})
        engine.schedule.save(progress)
        assert engine.offsets.all() == {("billing", "orders", 2): 17}, "the scheduler is not a consumer group"
    finally:
        engine.close()
    engine = get_plugin_manager().store_engine("file")(StoreSettings(data_dir=str(data)))
    try:
        assert engine.schedule.load() == progress
        assert engine.offsets.all() == {("billing", "orders", 2): 17}
    finally:
        engine.close()
