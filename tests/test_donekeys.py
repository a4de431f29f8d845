"""The done ids of output files: the compact KeySet and the index that spares a resume re-reading them."""

from __future__ import annotations

import os
import random
from array import array
from pathlib import Path

from gen_pipeline.records import Completion, id_key
from gen_pipeline.resume.settled import scan
from gen_pipeline.rundir.donekeys import BUCKET_SHIFT, INDEX_DIR, KeySet, completion_keys
from gen_pipeline.rundir.layout import COMPLETIONS
from gen_pipeline.samples import place_key, sample_key


def test_keyset_is_a_sorted_set_of_keys():
    keys = KeySet([9, 2**64 - 1, 0, 7, 7])
    assert list(keys) == [0, 7, 7, 9, 2**64 - 1]
    assert all(k in keys for k in (0, 7, 9, 2**64 - 1))
    assert not any(k in keys for k in (1, 8, 10, -1, "7"))
    assert keys.position(9) == 3 and keys.position(9) == 3 and keys.position(8) == -1
    assert 5 not in KeySet()


def test_keyset_agrees_with_a_set_on_random_and_boundary_keys():
    rng = random.Random(3)
    edges = [0, 1, 2**64 - 1, 2**64 - 2] + [(b << BUCKET_SHIFT) + d for b in (1, 7, 65535) for d in (-1, 0, 1)]
    members = set(rng.getrandbits(64) for _ in range(20000)) | set(edges[::2])
    keys = KeySet(members)
    probes = list(members)[:3000] + [rng.getrandbits(64) for _ in range(3000)] + edges
    assert [k in keys for k in probes] == [k in members for k in probes]
    assert all(keys.keys[keys.position(k)] == k for k in members)


def line(i: object) -> bytes:
    return Completion(
        i, [{"role": "user", "content": f"q {i}"}], "a", "stop", 5, 5, 1, 8, "s", 1, 0.1, "m", {}
    ).to_line()


def indexed(path: Path) -> tuple[list[int], list[int]]:
    found = completion_keys(path)
    return list(found.keys), found.corrupt


def test_the_index_is_written_and_used(tmp_path):
    path = tmp_path / COMPLETIONS
    path.write_bytes(line("a") + line("b"))
    assert indexed(path) == (sorted([id_key("a"), id_key("b")]), [])
    index = tmp_path / INDEX_DIR / (COMPLETIONS + ".idx")
    assert index.exists()
    # swap one key in the index for another: a read that uses the index returns it, the file is not re-read
    raw = index.read_bytes()
    head, body = raw[: raw.index(b"\n") + 1], raw[raw.index(b"\n") + 1 :]
    planted = array("Q", sorted([id_key("a"), id_key("planted")]))
    assert len(body) == len(planted.tobytes())
    index.write_bytes(head + planted.tobytes())
    assert indexed(path)[0] == list(planted)


def test_appended_lines_and_an_unfinished_tail_are_read_after_the_index(tmp_path):
    path = tmp_path / COMPLETIONS
    path.write_bytes(line(1) + b"garbage\n" + line(2))
    indexed(path)
    with path.open("ab") as f:
        f.write(line(3) + b"{not json\n" + line(4)[:-1])  # the last line has no newline yet (a writer is busy)
    got = indexed(path)
    assert got == (sorted(id_key(i) for i in (1, 2, 3, 4)), [2, 5])
    with path.open("ab") as f:
        f.write(b"\n" + line(5))  # the tail is finished: now it is indexed too
    assert indexed(path) == (sorted(id_key(i) for i in (1, 2, 3, 4, 5)), [2, 5])
    os.replace(tmp_path / INDEX_DIR, tmp_path / "old-index")
    assert indexed(path) == fresh_copy(path)


def fresh_copy(path: Path) -> tuple[list[int], list[int]]:
    found = completion_keys(path, save=False)
    return list(found.keys), found.corrupt


def test_a_changed_file_is_read_again_in_full(tmp_path):
    path = tmp_path / COMPLETIONS
    rows = [line(i) for i in range(3000)]  # ~500 kB: more than the sampled blocks cover
    path.write_bytes(b"".join(rows))
    indexed(path)
    # a new file under the same name (an editor, sed -i, mv): another inode
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(b"".join(rows[:1000] + rows[2000:]))
    os.replace(replacement, path)
    assert indexed(path) == fresh_copy(path)
    # cut short in place (same inode)
    with path.open("r+b") as f:
        f.truncate(len(b"".join(rows[:500])))
    assert indexed(path) == fresh_copy(path)
    assert len(indexed(path)[0]) == 500
    # rewritten in place, same inode, longer than before: the sampled bytes differ
    with path.open("r+b") as f:
        f.write(b"".join(rows[1:600]))
    assert indexed(path) == fresh_copy(path)
    assert len(indexed(path)[0]) == 599


def test_scan_with_the_index_equals_scan_without(tmp_path):
    path = tmp_path / COMPLETIONS
    path.write_bytes(b"".join(line(i) for i in range(200)) + b"bad\n")
    first = scan(tmp_path, repair=False)
    with path.open("ab") as f:
        f.write(b"".join(line(i) for i in range(200, 260)))
    second = scan(tmp_path, repair=False)
    os.replace(tmp_path / INDEX_DIR, tmp_path / "old-index")
    third = scan(tmp_path, repair=False, save_index=False)
    assert list(second.done) == list(third.done) and len(second.done) == 260 == len(first.done) + 60
    assert second.corrupt_lines == third.corrupt_lines == [f"{COMPLETIONS}:201"]
    assert not (tmp_path / INDEX_DIR).exists()  # save_index=False (check) writes nothing


def completion(i: object) -> Completion:
    return Completion(i, [{"role": "user", "content": f"q {i}"}], "a", "stop", 5, 5, 1, 8, "s", 1, 0.1, "m", {})


def test_the_writer_keeps_the_index_of_its_file_current(tmp_path):
    """A run's own appends are indexed (at close, and every INDEX_EVERY s), so the first resume after a
    crash reads only what came after the last save."""
    import orjson

    from gen_pipeline.rundir.store import RunWriter

    path = tmp_path / COMPLETIONS
    path.write_bytes(completion("old").to_line())
    state = scan(tmp_path, repair=False)
    writer = RunWriter(tmp_path, 1.0, state.files[COMPLETIONS])
    for i in range(5):
        writer.write_completion(completion(i))
    writer.close()
    raw = (tmp_path / INDEX_DIR / (COMPLETIONS + ".idx")).read_bytes()
    head = orjson.loads(raw[: raw.index(b"\n")])
    assert (head["lines"], head["count"], head["size"]) == (6, 6, path.stat().st_size)
    with path.open("ab") as f:  # a later run killed before its first save
        f.write(completion("late").to_line())
    assert indexed(path) == fresh_copy(path)
    assert len(indexed(path)[0]) == 7


def restarted(i: object, sample: int, restart: int) -> Completion:
    done = completion(i)
    done.sample, done.restart = sample, restart
    done.key = place_key(id_key(i), sample, 0, restart)
    return done


def test_the_index_keeps_the_restart_generations_of_the_lines_it_read_and_the_writer_wrote(tmp_path):
    """The newest restart generation of each (id, sample) answered again is known from a read of the file,
    from its index without re-reading it, and from the lines a run appended since; a scan merges them with
    the ledger's, and settles each (id, sample) in its newest generation only."""
    from gen_pipeline.rundir.store import RunWriter

    path = tmp_path / COMPLETIONS
    path.write_bytes(b"".join(x.to_line() for x in (completion("a"), restarted("a", 0, 1), restarted("b", 1, 2))))
    want = {sample_key(id_key("a"), 0): 1, sample_key(id_key("b"), 1): 2}
    assert completion_keys(path).restarts == want
    assert completion_keys(path, save=False).restarts == want  # from the index
    writer = RunWriter(tmp_path, 1.0, completion_keys(path))
    writer.write_completion(restarted("a", 0, 3))
    writer.close()
    found = completion_keys(path, save=False)
    assert found.restarts == {**want, sample_key(id_key("a"), 0): 3} == completion_keys(path, save=False).restarts
    (tmp_path / "failures.jsonl").write_bytes(b'{"id":"c","sample":0,"restart":4,"reason":"timeout","time":1}\n')
    state = scan(tmp_path, repair=False)
    assert state.generation(sample_key(id_key("c"), 0)) == 4 and state.generation(id_key("a")) == 3
    assert state.row_settled(id_key("a"), frozenset()) == "done" and state.row_settled(id_key("c"), frozenset()) is None
    assert state.settled(id_key("b"), frozenset()) is None  # b has only sample 1


def test_the_writer_keeps_no_index_for_a_file_the_scan_did_not_see_whole(tmp_path):
    from gen_pipeline.rundir.store import RunWriter

    path = tmp_path / COMPLETIONS
    path.write_bytes(completion("a").to_line() + completion("b").to_line()[:-3])  # unfinished last line
    found = completion_keys(path, save=False)
    assert not found.complete
    for given in (found, None):  # None: a file that exists but was never scanned
        writer = RunWriter(tmp_path, 1.0, given)
        assert writer.index is None
        writer.close()


def test_keymap_behaves_like_a_dict_across_merges():
    from gen_pipeline.rundir.donekeys import KeyMap

    class Small(KeyMap):
        MERGE_AT = 50  # merge often

    rng = random.Random(5)
    m, d = Small(), {}
    pool = [rng.getrandbits(64) for _ in range(3000)] + [0, 2**64 - 1]
    for _ in range(20000):
        k = rng.choice(pool)
        v = rng.getrandbits(64)
        assert m.first(k, v) == d.get(k)
        d.setdefault(k, v)
        if rng.random() < 0.05:
            m[k] = d[k] = v
    assert len(m) == len(d) and len(m.frozen) > 0  # merges happened
    assert all(m.get(k) == d.get(k) for k in pool) and all((k in m) == (k in d) for k in pool)
    assert m.get(12345) is None and 12345 not in m


def test_merge_sorted_equals_sorting_everything():
    from gen_pipeline.rundir.donekeys import merge_sorted

    rng = random.Random(9)
    old = sorted(rng.getrandbits(64) for _ in range(5000))
    for new in ([], [0], [2**64 - 1], [rng.getrandbits(64) for _ in range(700)], old[:3]):
        assert list(merge_sorted(array("Q", old), new)) == sorted(old + list(new))
    assert list(merge_sorted(array("Q"), [3, 1, 2])) == [1, 2, 3]
    small = array("Q", sorted(rng.getrandbits(64) for _ in range(50)))
    assert list(merge_sorted(array("Q", old), small, new_sorted=True)) == sorted(old + list(small))
