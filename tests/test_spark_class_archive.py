"""The class archive of Spark's driver JVM (``dpstream.spark.class_archive``).

The first tests need no JVM: where an archive may be used from, which archive is
used, what is tidied, and what :func:`finish` keeps, with a stand-in process for
the JVM. The last runs ``dpstream run --engine spark`` twice in real processes:
the first run's JVM writes the archive as it exits and the second maps it.

Skips as tests/test_spark.py does (no PySpark, no Java); CI sets
``DPSTREAM_REQUIRE_SPARK=1``, which turns a skip into a failure.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import fixed_key, own_ledger, require_spark

require_spark()

import pyspark  # noqa: E402

from dpstream.spark import class_archive as ca  # noqa: E402

pytestmark = pytest.mark.spark

_PYSPARK_4 = int(pyspark.__version__.split(".")[0]) >= 4


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An archive directory of this test's, and the Spark settings the key reads unset."""
    if not _PYSPARK_4:
        pytest.skip("the class archive needs PySpark 4 (Java 17)")
    where = tmp_path / "cache"
    monkeypatch.setenv(ca.ENV, str(where))
    for name in ("SPARK_CONF_DIR", "SPARK_HOME", *ca._OTHERS_OPTIONS, *ca._NOT_OUR_DRIVER):
        monkeypatch.delenv(name, raising=False)
    return where


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false", ""])
def test_the_archive_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ca.ENV, value)
    assert ca.prepare() is None


def test_only_a_directory_no_one_else_can_write_or_swap_is_used(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM runs what the archive holds: it is used only from a private directory
    whose parents no one else can write (or are sticky, as /tmp)."""
    cache.mkdir(mode=0o700)
    assert ca.prepare() is not None  # private: used
    os.chmod(cache, 0o770)
    assert ca.prepare() is None  # the group can write it
    os.chmod(cache, 0o700)
    link = cache.parent / "link"
    link.symlink_to(cache)
    monkeypatch.setenv(ca.ENV, str(link))
    got = ca.prepare()
    assert got is not None and got.directory == cache  # the link resolved, then checked
    open_parent = cache.parent / "open"
    open_parent.mkdir(mode=0o700)
    os.chmod(open_parent, 0o777)  # anyone could rename the directory below and swap it
    monkeypatch.setenv(ca.ENV, str(open_parent / "cache"))
    assert ca.prepare() is None and not (open_parent / "cache").exists()
    os.chmod(open_parent, 0o1777)  # sticky, as /tmp: only the owner renames its entries
    assert ca.prepare() is not None
    for plain_not in ("with space", "a:b"):  # the JVM's option string splits on these
        monkeypatch.setenv(ca.ENV, str(cache.parent / plain_not))
        assert ca.prepare() is None and not (cache.parent / plain_not).exists()
    monkeypatch.setenv(ca.ENV, "relative/dir")  # "~" without a home, say
    assert ca.prepare() is None and not Path("relative").exists()


def test_no_archive_is_written_under_options_others_give_the_jvm(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM refuses to start, or prints errors on the output, when asked to write an
    archive under an agent, -Xshare:off or a configuration directory with files on its
    class path: the archive is then not written (one already kept is still mapped, as
    the JVM checks it against its own options)."""
    for name in ca._OTHERS_OPTIONS:
        monkeypatch.setenv(name, "-javaagent:/x.jar")
        assert ca.prepare() is None, name
        monkeypatch.delenv(name)
    first = ca.prepare()
    assert first is not None and first.saving is not None
    kept = cache / f"spark-{first.key}-10.jsa"
    kept.write_bytes(b"x" * 10)
    os.chmod(kept, 0o400)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xlog:class+load")
    assert f"-XX:SharedArchiveFile={kept} " in ca.prepare().java_options  # type: ignore[union-attr]
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert ca.prepare() is not None  # an empty directory on the class path is fine
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    assert ca.prepare() is None  # neither written nor mapped
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "4000")  # spark-submit started the JVM
    assert ca.prepare() is None


def test_a_failed_write_is_not_tried_again(cache: Path) -> None:
    first = ca.prepare()
    assert first is not None and first.saving is not None and first.log is not None
    ca.give_up(first)
    assert not first.log.exists()
    assert ca.prepare() is None
    assert [p.name for p in cache.iterdir()] == [f"spark-{first.key}.failed"]


def test_the_first_run_writes_and_a_later_run_maps_a_whole_private_archive(cache: Path) -> None:
    first = ca.prepare()
    assert first is not None and first.saving is not None and first.log is not None
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert f"-XX:ArchiveClassesAtExit={first.saving}" in first.java_options
    assert "-XX:SharedArchiveFile" not in first.java_options
    assert "-Xlog:cds*=off" in first.java_options  # the JVM's notes stay off the output

    # an archive cut short (its size is not the one in its name) would crash the JVM:
    # it is deleted, and the run writes a new one
    short = cache / f"spark-{first.key}-1000.jsa"
    short.write_bytes(b"x" * 999)
    os.chmod(short, 0o400)
    again = ca.prepare()
    assert again is not None and again.saving is not None and not short.exists()

    # a whole archive others can write is not used (nor deleted: it is not ours to judge)
    whole = cache / f"spark-{first.key}-1000.jsa"
    whole.write_bytes(b"x" * 1000)
    os.chmod(whole, 0o622)
    assert ca.prepare().saving is not None  # type: ignore[union-attr]
    assert whole.exists()
    os.chmod(whole, 0o400)
    used = ca.prepare()
    assert used is not None and used.saving is None and used.log is None
    assert f"-XX:SharedArchiveFile={whole} -XX:+VerifySharedSpaces" in used.java_options

    # another install's archive is not this one's
    other = cache / f"spark-{'0' * 16}-1000.jsa"
    whole.rename(other)
    assert ca.prepare().saving is not None  # type: ignore[union-attr]


def test_the_key_follows_the_spark_install(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ca.setup_key()
    assert ca.setup_key() == base and len(base) == 16
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-core.jar").write_bytes(b"1")
    monkeypatch.setenv("SPARK_HOME", str(home))
    other = ca.setup_key()
    assert other != base
    (home / "jars" / "spark-core.jar").write_bytes(b"22")  # an upgrade in place
    assert ca.setup_key() not in (base, other)


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_tidy_deletes_what_stopped_runs_left_and_archives_unused_for_a_month(
    cache: Path,
) -> None:
    cache.mkdir(mode=0o700)
    hour, two_days, month = 3600.0, 2 * 86400.0, 31 * 86400.0
    dead, alive = _dead_pid(), os.getpid()
    files = {
        f"spark-{'a' * 16}.{dead}-0123abcd.part": (hour, False),  # its run ended
        f"spark-{'a' * 16}.{dead}-0123abcd.part.log": (hour, False),
        f"spark-{'a' * 16}.{alive}-0123abcd.part": (hour, True),  # its run goes on
        f"spark-{'a' * 16}.{dead}-4567abcd.part": (10.0, True),  # still being written
        # a day old: stale whatever its process id says (a container's pid 1)
        f"spark-{'a' * 16}.{alive}-89abcdef.part": (two_days, False),
        f"spark-{'d' * 16}.failed": (month, False),  # a failed write: tried again
        f"spark-{'e' * 16}.failed": (hour, True),
        f"spark-{'b' * 16}-5.jsa": (month, False),  # an install gone
        f"spark-{'c' * 16}-5.jsa": (hour, True),
        "notes.txt": (month, True),  # not an archive
    }
    now = time.time()
    for name, (age, _) in files.items():
        (cache / name).write_bytes(b"12345")
        os.utime(cache / name, (now - age, now - age))
    ca._tidy(cache)
    assert {p.name for p in cache.iterdir()} == {n for n, (_, kept) in files.items() if kept}


_FAKE_JVM = """
import sys
sys.stdin.read()  # the driver closes the JVM's input: it exits, writing the archive
part, log, written, status = sys.argv[1:]
open(part, "wb").write(b"a" * 4096)
note = "Written dynamic archive" if written == "1" else "Dumping"
open(log, "w").write("[info][cds,dynamic] " + note + "\\n")
sys.exit(int(status))
"""


@pytest.mark.parametrize(
    ("written", "status", "kept"),
    [("1", "0", True), ("0", "0", False), ("1", "1", False)],
    ids=["whole", "stopped-while-writing", "failed"],
)
def test_finish_keeps_only_an_archive_the_jvm_wrote_whole(
    cache: Path, written: str, status: str, kept: bool
) -> None:
    archive = ca.prepare()
    assert archive is not None and archive.saving is not None and archive.log is not None
    jvm = subprocess.Popen(
        [sys.executable, "-c", _FAKE_JVM, str(archive.saving), str(archive.log), written, status],
        stdin=subprocess.PIPE,
    )
    got = ca.finish(archive, jvm, timeout_s=60)
    assert not archive.saving.exists() and not archive.log.exists()
    if not kept:
        assert got is None and not list(cache.glob("*.jsa"))
        assert [p.name for p in cache.iterdir()] == [f"spark-{archive.key}.failed"]
        return
    assert got == cache / f"spark-{archive.key}-4096.jsa"
    assert stat.S_IMODE(os.stat(got).st_mode) == 0o400
    assert [p.name for p in cache.iterdir()] == [got.name]
    used = ca.prepare()
    assert used is not None and f"-XX:SharedArchiveFile={got} " in used.java_options


def test_runs_writing_at_once_keep_one_archive_and_delete_none(cache: Path) -> None:
    """Two first runs at once: each keeps its archive under a name no other run's
    replaces, so an archive a running JVM maps is never deleted or overwritten."""
    runs = [ca.prepare() for _ in range(3)]  # all three start before any has kept one
    assert all(r is not None and r.saving is not None for r in runs)
    assert len({r.saving for r in runs}) == 3  # type: ignore[union-attr]
    kept = []
    for archive, size in zip(runs, (4096, 4096, 8192), strict=True):
        assert archive is not None and archive.saving is not None and archive.log is not None
        archive.saving.write_bytes(b"a" * size)
        archive.log.write_text(f"[info][cds,dynamic] Written dynamic archive {size}\n")
        jvm = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)  # fmt: skip
        kept.append(ca.finish(archive, jvm, timeout_s=60))
    key = runs[0].key  # type: ignore[union-attr]
    assert kept[0] == kept[1] == cache / f"spark-{key}-4096.jsa"
    assert kept[2] == cache / f"spark-{key}-8192.jsa"
    assert sorted(p.name for p in cache.iterdir()) == sorted(p.name for p in kept[1:])


def test_a_second_run_maps_the_archive_the_first_run_wrote(tmp_path: Path) -> None:
    """Two real ``dpstream run --engine spark`` processes: the first JVM writes the
    archive as it exits, the second loads Spark's classes from it (its class-loading
    log says so), and both release the same rows with nothing from the JVM on stdout."""
    if not _PYSPARK_4:
        pytest.skip("the class archive needs PySpark 4 (Java 17)")
    fixed_key("class-archive").save(tmp_path / "k.key")
    events = [{"t": 1, "items": ["a", "b"]}, {"t": 2, "items": ["b"]}, {"t": 3, "items": ["a"]}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    cache = tmp_path / "cache"
    loads = tmp_path / "classes-%p.log"  # the JVM's own log of where each class came from
    clean = {k: v for k, v in os.environ.items() if k not in ca._OTHERS_OPTIONS}
    outs = []
    for run in (1, 2):
        env = {**clean, ca.ENV: str(cache)}
        if run == 2:  # an option of another party: no writing, but mapping goes on
            env["JAVA_TOOL_OPTIONS"] = f"-Xlog:class+load=info:file={loads}"
        out = tmp_path / f"out{run}"
        done = subprocess.run(
            [sys.executable, "-m", "dpstream", "run", "-m", "unknown", "--max-items", "2",
             "--rho", "1", "--threshold-delta", "1e-3", "-T", "3", "--key-file",
             str(tmp_path / "k.key"), "-i", str(tmp_path / "events.jsonl"), "--engine", "spark",
             "--master", "local[1]", "-o", str(out), *own_ledger(out)],
            capture_output=True, text=True, env=env, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "[warning]" not in done.stdout + done.stderr and "cds" not in done.stdout
        assert ("saves the classes its JVM loads" in done.stderr) is (run == 1)
        outs.append(sorted(x for p in out.glob("part-*") for x in p.read_text().splitlines()))
        archives = list(cache.iterdir())
        assert len(archives) == 1 and archives[0].suffix == ".jsa", archives
        assert archives[0].stat().st_size == int(archives[0].stem.rsplit("-", 1)[1])
    assert outs[0] == outs[1] and outs[0]

    def source_of(name: str, log: Path) -> str:
        lines = [x for x in log.read_text().splitlines() if f" {name} source: " in x]
        assert lines, f"{name} not loaded in {log}"
        return lines[0].split(" source: ", 1)[1]

    logs = [p for p in tmp_path.glob("classes-*.log")]
    sc_logs = [p for p in logs if " org.apache.spark.SparkContext " in p.read_text()]
    assert len(sc_logs) == 1  # the second driver (the launcher's JVM loads no SparkContext)
    assert source_of("org.apache.spark.SparkContext", sc_logs[0]) == "shared objects file (top)"


_REFUSED_START = """
import sys
from pathlib import Path
from dpstream.spark import class_archive as ca, session
where, key = Path(sys.argv[1]), "0123456789abcdef"
part = where / f"spark-{key}.1-00000000.part"
log = Path(f"{part}.log")
log.touch()
# options the JVM refuses to start under (as it refuses to write an archive under an agent)
refused = ca.ClassArchive("-XX:+NoSuchOptionOfDpstream", where, key, saving=part, log=log)
session.class_archive.prepare = lambda: refused
spark = session.start_session("local[1]")
print("rows", spark.range(3).count())
"""


def test_a_jvm_that_cannot_start_writing_starts_without_the_archive(
    cache: Path, tmp_path: Path
) -> None:
    """A driver JVM that refuses the writing options is started again without them (the
    run goes on), and the failure is remembered so later runs do not try again."""
    cache.mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-c", _REFUSED_START, str(cache)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable),
                                                     os.environ.get("PATH", "")])},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 3" in done.stdout
    assert [p.name for p in cache.iterdir()] == ["spark-0123456789abcdef.failed"]
