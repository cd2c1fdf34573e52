"""The record hot path in both implementations: equeue_core/_native.c against the Python functions of
equeue_core/record.py (and client/message.py's decode_batch), which are its specification.

Every case runs both and requires the same outcome: the same value (bytes for bytes) or the same
exception type, message and details, on valid batches (hypothesis round trips), corrupted ones and
odd arguments. And the native module must really be built wherever a C compiler is present.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import crc32c as crc32c_package
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equeue_core import record
from equeue_core.client import message

ROOT = Path(__file__).resolve().parent.parent


def c_compiler_present() -> bool:
    """What setuptools needs to build the extension: the configured C compiler and Python.h."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return bool(cc) and shutil.which(cc[0]) is not None and headers.exists()


def native_module():
    """equeue_core._native, imported whatever EQUEUE_PURE_PYTHON says (None if it was not built)."""
    try:
        from equeue_core import _native
    except ImportError:
        return None
    return _native


IMPLS = ["python"] + (["native"] if native_module() is not None or c_compiler_present() else [])


class Impl:
    """One implementation's functions under the record module's names."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "python":
            funcs = dict(record.PYTHON_FUNCTIONS, decode_batch=message.python_decode_batch,
                         msg_ids=message.python_msg_ids)
        else:
            mod = native_module()
            if mod is None:
                pytest.fail("a C compiler is present but equeue_core._native was not built: "
                            "`pip install -e .` must build it (setup.py)")
            if record.native_module is not mod:
                pytest.fail("equeue_core._native is built but record.py did not load it")
            funcs = dict(record.NATIVE_FUNCTIONS, decode_batch=mod.decode_batch, msg_ids=mod.msg_ids)
        self.__dict__.update(funcs)


@pytest.fixture(params=IMPLS)
def impl(request) -> Impl:
    return Impl(request.param)


def outcome(fn, *args, **kwargs):
    """What a call did: ("ok", value) or ("raised", type, message, details)."""
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 -- the comparison is the point
        return ("raised", type(e), str(e), getattr(e, "details", None))


def both(fn_name: str, *args, **kwargs):
    """Run fn_name in both implementations on copies of mutable arguments; assert the same outcome
    (and the same bytes left in a bytearray argument); return it."""
    results = []
    for name in IMPLS:
        impl = Impl(name)
        call_args = [bytearray(a) if isinstance(a, bytearray) else a for a in args]
        got = outcome(getattr(impl, fn_name), *call_args, **kwargs)
        touched = [bytes(a) for a in call_args if isinstance(a, bytearray)]
        results.append((got, touched))
    for other in results[1:]:
        assert other == results[0]
    return results[0][0]


# ---------------------------------------------------------------- the module is built and used

def test_native_module_is_built_where_a_c_compiler_is_present():
    if c_compiler_present():
        assert native_module() is not None, (
            "a C compiler and Python.h are here but equeue_core._native was not built by `pip install -e .`")
        assert "native" in IMPLS
    else:
        assert record.IMPLEMENTATION == "python"


def test_record_and_decode_batch_use_the_native_functions_when_built():
    mod = native_module()
    if mod is None:
        assert record.scan is record.PYTHON_FUNCTIONS["scan"]
        return
    if os.environ.get("EQUEUE_PURE_PYTHON", "") not in ("", "0"):
        assert record.scan is record.PYTHON_FUNCTIONS["scan"]
        return
    for name in record.HOT_PATH:
        assert getattr(record, name) is getattr(mod, name)
    assert message.decode_batch is mod.decode_batch
    assert message.DECODE_BATCH_BUILDS == "slots"
    assert record.IMPLEMENTATION.startswith("native")


def test_equeue_pure_python_forces_the_python_functions():
    code = ("from equeue_core import record; from equeue_core.client import message; "
            "print(record.IMPLEMENTATION, record.scan is record.PYTHON_FUNCTIONS['scan'], "
            "message.decode_batch is message.python_decode_batch)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "EQUEUE_PURE_PYTHON": "1"},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["python", "True", "True"]


# ---------------------------------------------------------------- crc32c

def native_crc_variants():
    mod = native_module()
    if mod is None:
        return []
    variants = [("selected", mod.crc32c), ("table", mod.crc32c_table)]
    if mod.crc32c_implementation() == "sse4.2":
        variants.append(("sse4.2", mod.crc32c_sse42))
    return variants


def test_native_crc32c_equals_the_crc32c_package_on_every_length_and_alignment():
    variants = native_crc_variants()
    if not variants:
        assert "native" not in IMPLS
        return
    rng = random.Random(15)
    data = rng.randbytes(24583 + 64)
    mv = memoryview(data)
    # every short length; around the three-lane blocks (3 x 128 and 3 x 4096 bytes) of the SSE4.2 path
    for length in [*range(0, 130), 255, 256, 257, *range(376, 400), *range(760, 776), 1000, 1023, 1024, 1151,
                   1152, 1153, 4095, 4096, *range(12280, 12300), 24576, 24583]:
        for offset in range(0, 9):
            piece = mv[offset:offset + length]
            want = crc32c_package.crc32c(piece)
            for name, fn in variants:
                assert fn(piece) == want, (name, offset, length)
    big = rng.randbytes(3 * 1024 * 1024 + 5)  # over the size where the GIL is released
    for name, fn in variants:
        assert fn(big) == crc32c_package.crc32c(big), name
    assert variants[0][1](b"123456789") == 0xE3069283  # the standard check value of CRC-32C


def test_crc_spans_is_the_crc32c_of_each_span(impl):
    rng = random.Random(7)
    data = rng.randbytes(10_000)
    starts = [rng.randrange(0, 10_000) for _ in range(500)]
    ends = [rng.randrange(s, 10_001) for s in starts]
    got = impl.crc_spans(data, starts, ends)
    assert got.itemsize == 4
    assert list(got) == [crc32c_package.crc32c(data[a:b]) for a, b in zip(starts, ends, strict=True)]
    assert list(impl.crc_spans(data, [], [])) == []


def test_crc_spans_takes_numpy_index_arrays_and_gives_a_numpy_readable_result(impl):
    import numpy as np
    data = bytes(range(256)) * 40
    starts = np.arange(0, 10_000, 100, dtype=np.int64)
    ends = starts + np.arange(len(starts), dtype=np.int64)
    got = np.frombuffer(impl.crc_spans(memoryview(data), starts, ends), dtype=np.uint32)
    want = [crc32c_package.crc32c(data[a:b]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    assert got.tolist() == want
    got32 = impl.crc_spans(data, starts.astype(np.int32), ends.astype(np.uint32))
    assert list(got32) == want


@pytest.mark.parametrize("starts, ends", [
    ([0, 5], [3]),                 # different lengths
    ([5], [3]),                    # end before start
    ([-1], [3]),                   # before the data
    ([0], [101]),                  # past the data
    ([0, 1, 2], [1, 2, 1000]),     # the third span is the bad one
])
def test_crc_spans_refuses_a_span_outside_the_data_with_the_same_error(starts, ends):
    got = both("crc_spans", bytes(100), starts, ends)
    assert got[0] == "raised" and got[1] is ValueError


# ---------------------------------------------------------------- batches: hypothesis round trips

TOPIC_CHARS = "abcXYZ019_.-%"
texts = st.text(alphabet=st.characters(blacklist_characters="\x1f", blacklist_categories=("Cs",)), max_size=8)
records = st.fixed_dictionaries({
    "body": st.binary(max_size=300),
    "tag": st.none() | texts,
    "keys": st.lists(texts, max_size=3),
    "properties": st.none() | st.dictionaries(texts, texts, max_size=3),
    "queue_id": st.integers(0, 2**32 - 1),
    "born_ts": st.integers(-(2**63), 2**63 - 1),
    "reconsume": st.integers(0, 2**32 - 1),
})
topics = st.text(alphabet=TOPIC_CHARS, min_size=1, max_size=12) | st.sampled_from(["%RETRY%g1", "%DLQ%g1"])
hyp = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def batch_of(topic: str, recs: list[dict]) -> bytearray:
    return bytearray(b"".join(record.encode_record(topic, **r) for r in recs))


@hyp
@given(topic=topics, recs=st.lists(records, min_size=1, max_size=8), first=st.integers(0, 2**63),
       queue_id=st.integers(0, 2**32 - 1), store_ts=st.integers(-(2**63), 2**63 - 1),
       base=st.integers(0, 2**62), max_body=st.none() | st.integers(-1, 400))
def test_a_valid_batch_gives_the_same_results_in_both(topic, recs, first, queue_id, store_ts, base, max_body):
    batch = batch_of(topic, recs)
    scanned = both("scan", bytes(batch))
    assert scanned[0] == "ok"
    starts = scanned[1]
    both("scan", batch, topic=topic.encode(), max_body=max_body)
    both("scan", memoryview(batch), 0, len(batch), b"other", None)
    positions = [base + s for s in starts]
    got = both("stamp_batch", batch, starts, positions, first, queue_id, store_ts)
    assert got == ("ok", None)
    record.PYTHON_FUNCTIONS["stamp_batch"](batch, starts, positions, first, queue_id, store_ts)
    both("index_entries", batch, starts, positions)
    sizes = [record.record_size(batch, s) for s in starts]
    for s, size, p in zip(starts, sizes, positions, strict=True):
        assert both("verify", bytes(batch), s) == ("ok", size)
        assert both("damage", bytes(batch), s, size, p) == ("ok", None)
        both("damage", bytes(batch), s, size, p + 1)
    both("crc_spans", bytes(batch), [s + record.CRC_FROM for s in starts],
         [s + z for s, z in zip(starts, sizes, strict=True)])
    decoded = both("decode_batch", bytes(batch), "0A0B0C0D")
    assert decoded[0] == "ok" and len(decoded[1]) == len(recs)


@hyp
@given(topic=topics, recs=st.lists(records, min_size=1, max_size=4), data=st.data())
def test_a_corrupted_batch_gives_the_same_results_and_errors_in_both(topic, recs, data):
    clean = batch_of(topic, recs)
    starts = record.PYTHON_FUNCTIONS["scan"](clean)
    positions = [1000 + s for s in starts]
    record.PYTHON_FUNCTIONS["stamp_batch"](clean, starts, positions, 5, 1, 1_700_000_000_000)
    sizes = [record.record_size(clean, s) for s in starts]
    bad = bytearray(clean)
    for _ in range(data.draw(st.integers(1, 4), label="changes")):
        at = data.draw(st.sampled_from(starts), label="record") + data.draw(
            st.integers(0, record.HEADER_SIZE + 8), label="offset")
        if at < len(bad):
            bad[at] = data.draw(st.integers(0, 255), label="byte")
    if data.draw(st.booleans(), label="truncate"):
        del bad[data.draw(st.integers(0, len(bad)), label="cut"):]
    frozen = bytes(bad)
    both("scan", frozen)
    both("scan", frozen, topic=topic.encode(), max_body=data.draw(st.integers(0, 300), label="max_body"))
    both("stamp_batch", bad, starts, positions, 9, 2, 1_800_000_000_000)
    both("index_entries", frozen, starts, positions)
    both("decode_batch", frozen, "ID")
    for s, size, p in zip(starts, sizes, positions, strict=True):
        both("verify", frozen, s)
        both("verify", frozen, s, s + size)
        both("damage", frozen, s, size, p)
    both("crc_spans", frozen, [s + record.CRC_FROM for s in starts],
         [s + z for s, z in zip(starts, sizes, strict=True)])


# ---------------------------------------------------------------- errors and odd arguments

def stamped(n: int = 3, topic: str = "t", body: bytes = b"hello") -> tuple[bytes, list[int], list[int]]:
    b = bytearray(b"".join(record.encode_record(topic, body, "tag", ["k"], {"p": "v"}) for _ in range(n)))
    starts = record.PYTHON_FUNCTIONS["scan"](b)
    positions = [500 + s for s in starts]
    record.PYTHON_FUNCTIONS["stamp_batch"](b, starts, positions, 0, 0, 1)
    return bytes(b), starts, positions


def test_scan_refuses_a_batch_with_the_same_typed_errors_in_both():
    buf, starts, _ = stamped()
    size = len(buf) // 3
    assert both("scan", buf[:-1])[2] == f"bad record size {size} at {2 * size}"
    assert both("scan", buf[:size + 10])[2] == f"truncated record header at {size}"
    wrong_magic = bytearray(buf)
    wrong_magic[size + 4] = 0
    assert both("scan", bytes(wrong_magic))[2] == f"bad magic/version at {size}"
    lens = bytearray(buf)
    lens[size + 72] += 1
    assert both("scan", bytes(lens))[2] == f"record lengths do not add up at {size}"
    too_large = both("scan", buf, max_body=4)
    assert too_large[1] is record.MessageTooLargeError and too_large[3] == {"size": 5, "max": 4}
    assert both("scan", buf, topic=b"u")[1] is record.InvalidMessageError
    assert both("scan", buf, topic=b"tt")[1] is record.InvalidMessageError


@pytest.mark.parametrize("kwargs", [
    {"start": -10}, {"end": 10**6}, {"start": 5, "end": 3}, {"end": -1}, {"topic": "t"},
    {"topic": bytearray(b"t")}, {"max_body": 2**70}, {"max_body": 4.5}, {"start": True},
    {"start": 2**80}, {"end": None, "max_body": None, "topic": None},
])
def test_scan_with_odd_arguments_behaves_as_the_python_one(kwargs):
    buf, starts, _ = stamped()
    both("scan", buf, **kwargs)
    both("scan", memoryview(buf).cast("B", shape=[len(buf)]), **kwargs)


def test_scan_of_a_non_byte_memoryview_behaves_as_the_python_one():
    buf, _, _ = stamped(4, body=b"x" * 11)
    assert len(buf) % 4 == 0
    both("scan", memoryview(buf).cast("I"))
    both("scan", "not bytes")


@pytest.mark.parametrize("change", [
    "tuple_args", "range_positions", "generator_positions", "shorter_positions", "longer_positions",
    "bytes_buf", "negative_position", "queue_id_too_big", "overlapping_starts", "start_past_end",
    "float_store_ts", "huge_first_offset", "unsorted_starts",
])
def test_stamp_batch_with_odd_arguments_behaves_as_the_python_one(change):
    buf, starts, positions = stamped()
    b = bytearray(buf)
    args = [b, starts, positions, 7, 3, 99]
    if change == "tuple_args":
        args[1], args[2] = tuple(starts), tuple(positions)
    elif change == "range_positions":
        args[2] = range(10, 10 + len(starts))
    elif change == "generator_positions":
        args[2] = (p for p in positions)
    elif change == "shorter_positions":
        args[2] = positions[:-1]
    elif change == "longer_positions":
        args[2] = [*positions, 4]
    elif change == "bytes_buf":
        args[0] = buf
    elif change == "negative_position":
        args[2] = [positions[0], -1, positions[2]]
    elif change == "queue_id_too_big":
        args[4] = 2**32
    elif change == "overlapping_starts":
        args[1] = [starts[0], starts[0] + 4, starts[2]]
    elif change == "start_past_end":
        args[1] = [starts[0], starts[1], len(buf) - 10]
    elif change == "float_store_ts":
        args[5] = 1.5
    elif change == "huge_first_offset":
        args[3] = 2**64 - 2
    elif change == "unsorted_starts":
        args[1] = [starts[2], starts[0], starts[1]]
    if change == "generator_positions":
        for name in IMPLS:  # a generator is used up by the first call: one each
            b2 = bytearray(buf)
            impl_out = outcome(Impl(name).stamp_batch, b2, starts, (p for p in positions), 7, 3, 99)
            py_b = bytearray(buf)
            py_out = outcome(record.PYTHON_FUNCTIONS["stamp_batch"], py_b, starts, (p for p in positions), 7, 3, 99)
            assert (impl_out, bytes(b2)) == (py_out, bytes(py_b))
        return
    both("stamp_batch", *args)


@pytest.mark.parametrize("starts_positions", [
    ([0, 5], [1]), ([-5], [1]), ([10**6], [1]), ([0], [-1]), ([0], [2**64]), ((0,), (1,)), (range(1), [1]),
])
def test_index_entries_with_odd_arguments_behaves_as_the_python_one(starts_positions):
    buf, _, _ = stamped()
    both("index_entries", buf, *starts_positions)


index_entry = st.tuples(st.integers(0, 2**40), st.integers(0, 2**32 - 1), st.integers(0, 5))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(index_entry, max_size=40), adjacent=st.lists(st.booleans(), max_size=40),
       max_count=st.integers(-2, 45), max_bytes=st.one_of(st.integers(-5, 2**34), st.just(2**63 - 1)),
       tags=st.one_of(st.none(), st.frozensets(st.integers(0, 5)), st.sets(st.integers(0, 5))))
def test_index_runs_takes_the_same_records_in_both(entries, adjacent, max_count, max_bytes, tags):
    """A pull's walk over its index entries: the same spans (adjacent records merged), count and
    scanned in both, with and without a tag filter, at every count and byte limit."""
    packed = bytearray()
    end = None
    for i, (pos, size, th) in enumerate(entries):
        if end is not None and i < len(adjacent) and adjacent[i]:
            pos = end  # this record follows the previous one in the log: one span
        packed += record.INDEX_ENTRY.pack(pos, size, th)
        end = pos + size
    got = both("index_runs", bytes(packed), max_count, max_bytes, tags)
    assert got[0] == "ok"
    runs, count, scanned = got[1]
    assert count <= scanned <= len(entries) and (count == 0) == (runs == [])


@pytest.mark.parametrize("args", [
    (b"\0" * 19, 5, 100), (b"\0" * 20, 5.0, 100), (b"\0" * 20, 5, 100, [0]), (b"\0" * 20, True, 100),
    (b"\0" * 20, 5, 2**70), ("x" * 20, 5, 100), (bytearray(40), 2**70, 100),
])
def test_index_runs_with_odd_arguments_behaves_as_the_python_one(args):
    both("index_runs", *args)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(page=st.integers(1, 64), slots=st.integers(1, 6), lap=st.integers(0, 3), data=st.data())
def test_gather_runs_reads_the_same_spans_out_of_a_ring_in_both(page, slots, lap, data):
    """A pull's spans out of a paged ring (store_file's Ring): the same bytes, or None when a span
    is empty, too long or on a slot that does not hold its page, in both; and what the Python one
    returns is each span's bytes as one read of the ring would give them."""
    size = page * slots
    ring = bytes(random.Random(size * 7 + lap).randrange(256) for _ in range(size))
    held = [lap * slots + i for i in range(slots)]  # the ring's current lap
    for i in data.draw(st.lists(st.integers(0, slots - 1), max_size=2)):
        held[i] = data.draw(st.sampled_from([-1, held[i] - slots, held[i] + slots]))
    base = lap * size
    runs = []
    at = base + data.draw(st.integers(-page, size))
    for _ in range(data.draw(st.integers(0, 6))):
        n = data.draw(st.integers(-1, size))
        runs.append((at, at + n))
        at += max(n, 0) + data.draw(st.integers(0, page))
    got = both("gather_runs", ring, runs, page, held)
    assert got[0] == "ok"
    want = b""
    for start, end in runs:
        if start < 0 or end - start <= 0 or end - start > size - page or any(
                held[k % slots] != k for k in range(start // page, (end - 1) // page + 1)):
            want = None
            break
        want += bytes(ring[(start + i) % size] for i in range(end - start))
    assert got[1] == want


@pytest.mark.parametrize("args", [
    (bytes(8), [(0, 2)], 4, [0]), (bytes(8), [(0, 2)], 0, [0, 1]), (bytes(8), [(0, 2)], 4, (0, 1)),
    (bytes(8), [(0, 2, 3)], 4, [0, 1]), (bytes(8), [(0.0, 2)], 4, [0, 1]), (bytes(8), [[0, 2]], 4, [0, 1]),
    (bytes(8), [(0, 2)], 4, [0, True]), (bytes(8), [(0, 2)], 4, [0.0, 1]), (bytes(8), [(0, 2)], 4, [2**70, 1]),
    ("x" * 8, [(0, 2)], 4, [0, 1]), (bytes(8), [(0, 2**70)], 4, [0, 1]), (bytes(8), [(0, 2)], True, [0, 1]),
    (bytes(8), ((0, 2),), 4, [0, 1]), (memoryview(bytes(8)), [(4, 6), (0, 1)], 4, [0, 1]),
])
def test_gather_runs_with_odd_arguments_behaves_as_the_python_one(args):
    both("gather_runs", *args)


@pytest.mark.parametrize("start, limit", [
    (-1, None), (10**6, None), (0, 10**6), (5, 2), (0, 10), (True, None), (0, 2**70), (0.0, None),
])
def test_verify_with_odd_arguments_behaves_as_the_python_one(start, limit):
    buf, _, _ = stamped()
    both("verify", buf, start, limit)


def test_verify_and_damage_name_each_kind_of_damage_the_same_way():
    buf, starts, positions = stamped()
    size = len(buf) // 3
    cases = {"crc": 40, "magic": 4, "size": 0, "lens": 64}
    for what, at in cases.items():
        b = bytearray(buf)
        b[size + at] ^= 0xFF
        got = both("verify", bytes(b), size)
        assert got[0] == "raised" and got[1] is record.CorruptRecordError, what
        why = both("damage", bytes(b), size, size, positions[1])
        assert why[0] == "ok" and isinstance(why[1], str), what
    assert both("damage", buf, size, 0, positions[1])[1].startswith("lost")
    assert both("damage", buf, size, size, positions[1] + 1)[1] == (
        f"record says position {positions[1]}, expected {positions[1] + 1}")
    assert both("damage", buf, size, size + 1, positions[1])[1] == f"record is {size} bytes, its index entry says {size + 1}"
    for args in [(-1, size, 1), (10**6, size, 1), (size, -5, 1), (size, size, -1), (size, size, 2**64),
                 (size, 10**6, positions[1]), (size, 3, positions[1]), (size, size, 1.0)]:
        both("damage", buf, *args)


def test_decode_batch_refuses_and_decodes_as_the_python_one():
    buf, _, _ = stamped(topic="%RETRY%grp")
    retry = record.encode_record("%DLQ%grp", b"b", None, (), {"RETRY_TOPIC": "orders", "x": "y"})
    both("decode_batch", buf + retry, "AB")
    both("decode_batch", buf + retry, "pré")   # a non-ASCII id prefix
    both("decode_batch", buf, 12)              # not a str
    both("decode_batch", buf[:-3], "AB")
    both("decode_batch", buf[:50], "AB")
    both("decode_batch", b"", "AB")
    size = len(buf) // 3
    bad_utf8 = bytearray(buf)
    bad_utf8[size + record.HEADER_SIZE] = 0xFF
    got = both("decode_batch", bytes(bad_utf8), "AB")
    assert got[1] is UnicodeDecodeError
    bad_props = record.encode_record("t", b"b", None, (), {"a": "b"})
    bad_props = bad_props[:-2] + b"\xc1" + bad_props[-1:]
    both("decode_batch", bad_props, "AB")
    assert both("decode_batch", memoryview(buf)[size:], "AB")[0] == "ok"


@hyp
@given(prefix=st.text(max_size=24), positions=st.lists(st.integers(0, 2**64 - 1), max_size=50),
       as_tuple=st.booleans())
def test_msg_ids_of_a_send_answer_are_the_same_in_both(prefix, positions, as_tuple):
    got = both("msg_ids", prefix, tuple(positions) if as_tuple else positions)
    assert got[0] == "ok" and len(got[1]) == len(positions)


@pytest.mark.parametrize("args", [
    ("AB", [-1]), ("AB", [2**64]), ("AB", [True]), ("AB", [1.0]), ("AB", range(3)), ("AB", None),
    (5, [1]), ("pr\u00e9", [255]),
])
def test_msg_ids_with_odd_arguments_behaves_as_the_python_one(args):
    both("msg_ids", *args)


def test_a_batch_large_enough_to_release_the_gil_is_stamped_and_checked_the_same():
    rng = random.Random(3)
    recs = [record.encode_record("big", rng.randbytes(rng.randrange(0, 20_000))) for _ in range(40)]
    batch = bytearray(b"".join(recs))
    starts = record.PYTHON_FUNCTIONS["scan"](batch)
    positions = [s * 3 for s in starts]
    both("stamp_batch", batch, starts, positions, 1, 2, 3)
    record.PYTHON_FUNCTIONS["stamp_batch"](batch, starts, positions, 1, 2, 3)
    one = bytes(recs[0]) * 0 + bytes(batch)
    for s, p in zip(starts, positions, strict=True):
        size = record.record_size(one, s)
        both("verify", one, s)
        assert both("damage", one, s, size, p) == ("ok", None)
    both("crc_spans", one, [0], [len(one)])


def test_equeue_version_says_which_record_hot_path_runs():
    cmd = [sys.executable, "-m", "equeue_core.cli.main", "version"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"hot path  record={record.IMPLEMENTATION}" in out
    forced = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True,
                            env={**os.environ, "EQUEUE_PURE_PYTHON": "1"}).stdout
    assert "hot path  record=python" in forced
    if native_module() is not None and os.environ.get("EQUEUE_PURE_PYTHON", "") in ("", "0"):
        assert "record=native (crc32c " in out


# ---------------------------------------------------------------- encode_record

@hyp
@given(topic=topics, rec=records, data=st.data())
def test_encode_record_lays_out_the_same_bytes_in_both(topic, rec, data):
    args = dict(rec, born_ts=data.draw(st.none() | st.integers(-(2**63), 2**63 - 1), label="born"))
    if data.draw(st.booleans(), label="bytearray body"):
        args["body"] = bytearray(args["body"])
    got = {}
    for name in IMPLS:
        before = record.now_ms()
        out = outcome(Impl(name).encode_record, topic, **args)
        after = record.now_ms()
        assert out[0] == "ok"
        fields = list(record.header_fields(out[1]))
        if args["born_ts"] is None:  # the producer's clock: now, as Python's now_ms() reads it
            assert before <= fields[9] <= after
            fields[9] = 0
        got[name] = (fields, out[1][record.HEADER_SIZE:])
    assert len(set(map(repr, got.values()))) == 1


@pytest.mark.parametrize("args, kwargs", [
    (("t", b"b"), {"keys": ["a\x1fb"]}),
    (("t", b"b"), {"keys": ["ok", "a\x1fb"]}),
    (("t", b"b"), {"keys": "abc"}),
    (("t", b"b"), {"keys": [1]}),
    (("t", b"b"), {"keys": ["\ud800"]}),
    (("t", "str body"), {}),
    (("t", memoryview(b"mv")), {"born_ts": 1}),
    (("t", None), {}),
    (("t", b"b"), {"properties": {"k": 1}, "born_ts": 1}),
    (("t", b"b"), {"properties": {}, "born_ts": 1}),
    (("t", b"b"), {"tag": "", "born_ts": 1}),
    (("t", b"b"), {"tag": 5}),
    (("t", b"b"), {"tag": "\ud800"}),
    (("\ud800", b"b"), {}),
    ((b"t", b"b"), {}),
    (("t" * 70000, b"b"), {}),
    (("t", b"b"), {"tag": "x" * 70000}),
    (("t", b"b"), {"queue_id": -1}),
    (("t", b"b"), {"queue_id": 2**32}),
    (("t", b"b"), {"reconsume": 2**32}),
    (("t", b"b"), {"born_ts": 2**63}),
    (("t", b"b"), {"born_ts": 1.5}),
    (("t", b"b"), {"queue_id": True, "born_ts": 1}),
    (("t", b"b", "tag", ("k1", "k2"), {"p": "v"}, 3, 4, 5), {}),
])
def test_encode_record_with_odd_arguments_behaves_as_the_python_one(args, kwargs):
    if len(args) < 7:
        kwargs = {"born_ts": 1, **kwargs}  # a fixed producer clock: the bytes compare exactly
    both("encode_record", *args, **kwargs)


@pytest.mark.skipif("native" not in IMPLS, reason="no C compiler: only the Python implementation exists")
def test_native_functions_take_a_memoryview_without_falling_back_to_python():
    """A pull answer's body is a memoryview over the transport's buffer: the native decode_batch
    (and scan, verify, index_entries, index_runs, crc_spans) must decode it in C, not hand it to the Python
    version (a memoryview refused a format request without a shape, so every call fell back)."""
    mod = native_module()
    assert mod is not None
    buf, starts, positions = stamped()
    called: list[str] = []

    def spy(name, real):
        def fallback(*args, **kwargs):
            called.append(name)
            return real(*args, **kwargs)
        return fallback

    names = ("scan", "verify", "index_entries", "index_runs", "crc_spans")
    mod._bind(decode_batch=spy("decode_batch", message.python_decode_batch),
              **{n: spy(n, record.PYTHON_FUNCTIONS[n]) for n in names})
    try:
        for view in (memoryview(buf), memoryview(bytearray(buf))[0:], memoryview(buf).cast("B", shape=[len(buf)])):
            assert mod.decode_batch(view, "AB") == message.python_decode_batch(buf, "AB")
            assert list(mod.scan(view)) == starts
            mod.verify(view, starts[1])
            mod.index_entries(view, starts, positions)
            entries = mod.index_entries(buf, starts, positions)
            for entry_view in (memoryview(entries), memoryview(bytes(entries))):
                assert mod.index_runs(entry_view, 10, 10**6) == record.PYTHON_FUNCTIONS["index_runs"](entries, 10, 10**6)
            mod.crc_spans(view, [0], [len(buf)])
    finally:
        mod._bind(decode_batch=message.python_decode_batch,
                  **{n: record.PYTHON_FUNCTIONS[n] for n in names})
    assert called == []
