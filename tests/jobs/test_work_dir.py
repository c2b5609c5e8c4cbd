"""The work directory's paths (jobs/work_dir.py) on local disk: what the tests of the flow on
object storage (tests/flows/test_object_storage.py) exercise on an S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from precompute.jobs import work_dir
from precompute.jobs.staging import commit
from precompute.jobs.text.content_cache import POINTER, previous_run, promote
from precompute.jobs.work_dir import WorkPath
from precompute.stores.versions import new_version


def committed(run: WorkPath) -> WorkPath:
    commit(run, [])
    return run


def test_a_cache_pointer_names_its_run_relative_to_the_cache_so_a_moved_work_dir_keeps_it(
    tmp_path: Path,
) -> None:
    work = WorkPath.of(tmp_path / "work")
    run = committed(work_dir.run_dir(work, "docs", "v1") / "embeddings")
    cache = work_dir.cache_dir(work, "docs")
    promote(cache, run)
    assert (cache / POINTER).read_text() == "../../runs/docs/v1/embeddings"
    assert previous_run(cache) == run

    (tmp_path / "work").rename(tmp_path / "moved")
    moved = WorkPath.of(tmp_path / "moved")
    assert previous_run(work_dir.cache_dir(moved, "docs")) == moved / "runs" / "docs" / "v1" / "embeddings"


def test_a_pointer_written_before_holds_an_absolute_path_and_is_still_read(tmp_path: Path) -> None:
    run = committed(WorkPath.of(tmp_path / "runs" / "docs" / "v1"))
    cache = WorkPath.of(tmp_path / "cache" / "docs")
    cache.mkdir()
    Path(cache.path, POINTER).write_text(str(tmp_path / "runs" / "docs" / "v1"))
    assert previous_run(cache) == run


def test_a_file_is_replaced_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    report = WorkPath.of(tmp_path) / "reports" / "run.json"
    report.write_text(json.dumps({"a": 1}))
    report.write_text(json.dumps({"a": 2}))
    assert json.loads(report.read_text()) == {"a": 2}
    assert [p.name for p in report.parent.iterdir()] == ["run.json"]


def test_a_stream_that_fails_midway_leaves_the_old_file_whole(tmp_path: Path) -> None:
    state = WorkPath.of(tmp_path) / "state" / "index.npz"
    with state.writer() as out:
        np.savez(out, lists=np.arange(4))
    with pytest.raises(RuntimeError, match="killed"), state.writer() as out:
        out.write(b"half of a new file")
        raise RuntimeError("killed")
    with np.load(state.path) as saved:
        assert saved["lists"].tolist() == [0, 1, 2, 3]
    assert [p.name for p in state.parent.iterdir()] == ["index.npz"]


def test_runs_of_versions_the_store_no_longer_holds_are_deleted_and_newer_ones_kept(tmp_path: Path) -> None:
    runs = work_dir.runs(WorkPath.of(tmp_path), "docs")
    for version in ("v1", "v2", "v3", "v4"):
        committed(runs / version)
    work_dir.collect_runs(runs, current="v3", kept={"v2"})
    assert sorted(p.name for p in runs.iterdir()) == ["v2", "v3", "v4"]


def test_runs_are_collected_by_version_time_and_not_at_all_before_a_first_publish(tmp_path: Path) -> None:
    """Real version names (stores/versions.py new_version: UTC time, then a random suffix that
    sorts any way): older than the published one goes unless kept; nothing goes while nothing is
    published (a first night's folders are its runs in progress)."""
    runs = work_dir.runs(WorkPath.of(tmp_path), "docs")
    made = {when: f"20261207T{when}Z-{suffix}" for when, suffix in (("010000", "ffffff"), ("020000", "000000"), ("030000", "a1b2c3"), ("040000", "000001"))}
    for version in made.values():
        committed(runs / version)
    work_dir.collect_runs(runs, current=None, kept=set())
    assert sorted(p.name for p in runs.iterdir()) == sorted(made.values())
    work_dir.collect_runs(runs, current=made["030000"], kept={made["010000"]})
    assert sorted(p.name for p in runs.iterdir()) == [made["010000"], made["030000"], made["040000"]]
    assert new_version() > made["040000"]  # a version made now sorts after every older one


def test_a_copy_across_devices_where_no_link_can_be_made_is_a_whole_copy(tmp_path: Path) -> None:
    """/dev/shm is another filesystem: os.link fails there (EXDEV), and the copy falls back to
    writing the bytes, replacing the target whole and leaving nothing beside it."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem at /dev/shm on this machine")
    source = shm / f"precompute-test-{tmp_path.name}"
    try:
        source.write_bytes(b"x" * 4096)
        target = WorkPath.of(tmp_path / "target")
        target.write_bytes(b"old")
        work_dir.copy_file(target.fs, str(source), target.path)
        assert target.read_bytes() == b"x" * 4096 and (tmp_path / "target").stat().st_ino != source.stat().st_ino
        assert [p.name for p in tmp_path.iterdir()] == ["target"]
    finally:
        source.unlink(missing_ok=True)


def test_what_stays_on_this_machine_goes_beside_a_local_work_dir_and_apart_for_a_uri(tmp_path: Path) -> None:
    assert WorkPath.of(tmp_path).machine_dir() == tmp_path
    remote = WorkPath(WorkPath.of(tmp_path).fs, "bucket/precompute", "s3")
    assert str(remote) == "s3://bucket/precompute" and remote.local is None
    assert remote.machine_dir() == work_dir.LOCAL_STATE / "remote" / remote.machine_dir().name
    assert remote.machine_dir() != WorkPath(remote.fs, "bucket/other", "s3").machine_dir()


def test_a_local_copy_is_a_link_that_replaces_its_target_and_never_writes_through_it(tmp_path: Path) -> None:
    """The copy shares the source's bytes (no 256 MB written again), and copying over a target
    that is itself linked elsewhere replaces the name: the other link keeps its content."""
    source, target, elsewhere = (WorkPath.of(tmp_path / name) for name in ("source", "target", "elsewhere"))
    source.write_bytes(b"new")
    elsewhere.write_bytes(b"old")
    work_dir.copy_file(elsewhere.fs, elsewhere.path, target.path)
    work_dir.copy_file(source.fs, source.path, target.path)
    assert (tmp_path / "target").stat().st_ino == (tmp_path / "source").stat().st_ino
    assert target.read_bytes() == b"new" and elsewhere.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "source", "target"]


def test_a_mapped_column_is_patched_in_this_process_only_and_a_read_column_is_copied(tmp_path: Path) -> None:
    """A patch writes the mapping's private pages: the file, and every other reader's view of it,
    keep the bytes written; a table read whole (object storage) is patched in a copy."""
    file = WorkPath.of(tmp_path / "table.arrow")
    work_dir.write_ipc(file, pa.table({"x": pa.array(np.arange(1000, dtype=np.float32))}))
    table, mapped = work_dir.mapped_ipc(file)
    values = table["x"].chunk(0).to_numpy()
    patched = work_dir.patchable(values, mapped)
    assert patched.ctypes.data == values.ctypes.data  # the mapped bytes, not a copy
    patched[[3, 999]] = -1.0
    assert table["x"][3].as_py() == -1.0  # the same bytes, so the table sees the patch too
    assert (
        work_dir.read_ipc(file)["x"][3].as_py() == 3.0 and work_dir.read_ipc(file)["x"][999].as_py() == 999.0
    )
    copied = work_dir.patchable(values, None)
    copied[0] = 7.0
    assert values[0] == 0.0 and copied.ctypes.data != values.ctypes.data
