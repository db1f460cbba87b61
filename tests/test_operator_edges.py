"""Review 80: an operator's mistakes and another user's traps, refused in words before
anything is written (links planted in shared folders, pipes and devices where a file
belongs, a damaged sidecar, a deleted ledger)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dpstream import NoiseKey
from dpstream.cli import main

from .conftest import fixed_key, with_option

UNK = ["run", "-m", "unknown", "--max-items", "1", "--rho", "1", "--threshold-delta", "1e-3",
       "-T", "3"]  # fmt: skip


@pytest.fixture
def stream(tmp_path):
    key = tmp_path / "k.key"
    fixed_key("edges").save(key)
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in (1, 2, 3)))
    return {"key": str(key), "src": str(src)}


def _foreign_link(tmp_path, name):
    """A link at ``shared/name`` made by another user (nobody) in a sticky folder all may
    write, leading into ``victim/``: what the kernel's link protection guards against."""
    if os.geteuid() != 0:
        pytest.skip("making a link another user owns needs root")
    shared, victim = tmp_path / "shared", tmp_path / "victim"
    shared.mkdir()
    victim.mkdir()
    os.chmod(shared, 0o1777)
    link = shared / name
    os.symlink(victim / "planted", link)
    os.lchown(link, 65534, 65534)
    return link, victim / "planted"


def test_view_export_refuses_another_users_link_in_a_shared_folder(tmp_path, stream, capsys):
    out = tmp_path / "rel.jsonl"
    assert main([*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]) == 0
    link, planted = _foreign_link(tmp_path, "report.html")
    assert main(["view", str(out), "--export", str(link)]) == 1
    assert "symbolic link another user made" in capsys.readouterr().err
    assert not planted.exists() and not list(planted.parent.iterdir())


def test_run_refuses_an_output_link_another_user_made_in_a_shared_folder(tmp_path, stream, capsys):
    link, planted = _foreign_link(tmp_path, "rel.jsonl")
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(link)]
    assert main(argv) == 1
    assert "symbolic link another user made" in capsys.readouterr().err
    assert not list(planted.parent.iterdir())  # no output, no lock file, no sidecar


def test_run_refuses_an_output_under_a_folder_link_another_user_made(tmp_path, stream, capsys):
    """Review 82: only the path's last part was checked, so a link to a folder, planted
    in /tmp, led the output, its lock file and its sidecar there."""
    link, planted = _foreign_link(tmp_path, "dir")
    planted.mkdir()
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(link / "o.jsonl")]
    assert main(argv) == 1
    assert "goes through a symbolic link another user made" in capsys.readouterr().err
    assert not list(planted.iterdir())


@pytest.mark.parametrize("way", ["dot-dot", "own-link", "missing-dot-dot"])
def test_a_foreign_link_is_seen_through_dot_dot_and_through_ones_own_link(
    tmp_path, stream, capsys, way
):
    """Review 84: the check walked the path as text, so `shared/link/../o.jsonl` (the
    kernel follows the link, then goes up from its target) and one's own link that leads
    through another user's link both wrote where that user chose."""
    link, planted = _foreign_link(tmp_path, "dir")
    (planted / "sub").mkdir(parents=True)
    if way == "dot-dot":
        out = link / "sub" / ".." / "o.jsonl"
    elif way == "missing-dot-dot":  # review 85: a part not there, then `..`, then the link
        out = link.parent / "nothere" / ".." / link.name / "o.jsonl"
    else:
        (tmp_path / "mine").mkdir()
        os.symlink(link, tmp_path / "mine" / "own")
        out = tmp_path / "mine" / "own" / "o.jsonl"
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]
    assert main(argv) == 1
    assert "goes through a symbolic link another user made" in capsys.readouterr().err
    assert sorted(p.name for p in planted.iterdir()) == ["sub"]


def test_a_link_of_ones_own_is_followed(tmp_path, stream):
    target = tmp_path / "real.jsonl"
    link = tmp_path / "rel.jsonl"
    os.symlink(target, link)
    assert main([*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(link)]) == 0
    assert len(target.read_text().splitlines()) == 3


def test_state_with_a_pipe_as_output_is_refused_before_a_release(tmp_path, stream, capsys):
    """The run wrote step 1, then failed with "[Errno 22] Invalid argument" (fsync of a
    pipe) and left a state that could not resume."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    state = tmp_path / "s.sqlite"
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(fifo)]
    assert main([*argv, "--state", str(state)]) == 1
    assert "is not a regular file (a pipe or a device)" in capsys.readouterr().err
    assert not state.exists()


@pytest.mark.parametrize("kind", ["fifo", "device", "large"])
def test_a_key_file_that_is_not_a_key_file_is_refused_without_reading_it_all(
    tmp_path, stream, capsys, kind
):
    """`--key-file /dev/zero` read forever (6 GB in 4 s); a piped key was read twice (the
    second read found nothing); a large file given as the key was read whole."""
    out = tmp_path / "o.jsonl"
    more: list[str] = []
    if kind == "fifo":
        key = tmp_path / "key.fifo"
        os.mkfifo(key, 0o600)
        want = "is not a regular file"
    elif kind == "device":  # mode 0666: past the permission check only when allowed
        key, want, more = "/dev/zero", "is not a regular file", ["--allow-readable-key"]
    else:
        key = tmp_path / "big.key"
        key.write_bytes(b"0" * (1 << 20))
        os.chmod(key, 0o600)
        want = "is larger than a key file"
    argv = [*UNK, "--key-file", str(key), "-i", stream["src"], "-o", str(out), *more]
    assert main(argv) == 1
    assert want in capsys.readouterr().err
    assert not out.exists()


def test_an_output_where_no_file_can_be_made_is_an_error_not_a_spin(tmp_path, stream, capsys):
    """`-o /proc/x.jsonl` retried making its lock file forever at 100% CPU: the folder
    exists and says "no such file" each time."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc on this system")
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", "/proc/x.jsonl"]
    done: list[int] = []
    runner = threading.Thread(target=lambda: done.append(main(argv)), daemon=True)
    runner.start()
    runner.join(120)  # an error comes at once; a spinning run fails the assert
    assert done == [1]
    assert "/proc/x.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_view_refuses_a_releases_file_that_is_a_pipe_or_a_device(tmp_path, capsys, kind):
    """`dpstream view FIFO` waited for a writer and `view /dev/zero` read forever, before
    printing anything."""
    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "rel.fifo")
        os.mkfifo(path)
    assert main(["view", path, "--export", str(tmp_path / "page.html")]) == 1
    assert "is not a regular file" in capsys.readouterr().err
    assert not (tmp_path / "page.html").exists()


@pytest.mark.parametrize("value", [1.7, True, None, "2", 0])
def test_a_damaged_sidecar_noise_version_is_refused_in_words(tmp_path, stream, capsys, value):
    """A sidecar's `noise_version: 1.7` or `true` was read as 1, and `null` ended in a raw
    Python error: a damaged sidecar must not choose the noise of the next steps."""
    out = tmp_path / "o.jsonl"
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]
    assert main(argv) == 0
    sidecar = tmp_path / "o.jsonl.meta.json"
    meta = json.loads(sidecar.read_text())
    meta["noise_version"] = value
    sidecar.write_text(json.dumps(meta))
    before = out.read_bytes()
    assert main([*argv, "--force"]) == 1
    err = capsys.readouterr().err
    assert "records noise_version" in err and "edited or damaged" in err
    assert out.read_bytes() == before


@pytest.mark.parametrize("how", ["deleted", "moved"])
def test_a_ledger_gone_from_its_place_is_refused_until_it_is_named_or_forgotten(
    tmp_path, stream, capsys, key_registry, how
):
    """Deleting a key's ledger, or moving it (`mv`) and running without its new --ledger,
    started a new, empty ledger with a warning: the replay refusal was blind, and the
    same noise went out over other data (the releases differed by exactly the true
    counts' difference). Now refused in every command, before anything is written;
    the moved ledger named by --ledger is followed, and removing the registry entry is
    the deliberate way to start afresh."""
    out = tmp_path / "o.jsonl"
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]
    assert main(argv) == 0
    ledger = Path(stream["key"] + ".ledger")
    moved = tmp_path / "elsewhere.ledger"
    if how == "deleted":
        ledger.unlink()
    else:
        ledger.rename(moved)
    capsys.readouterr()
    other = tmp_path / "other.jsonl"
    other.write_text(Path(stream["src"]).read_text().replace('"t": 1,', '"t": 2,', 3))
    second = [*UNK, "--key-file", stream["key"], "-i", str(other), "-o", str(tmp_path / "p.jsonl")]
    for command in (second, ["budget", "--key-file", stream["key"]]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert "which is gone" in err and "remove the registry entry" in err, err
    assert not ledger.exists() and not (tmp_path / "p.jsonl").exists()
    if how == "moved":  # named where it went: the record follows it, and it refuses the
        assert main([*second, "--ledger", str(moved)]) == 1  # same scope over other data
        assert "earlier run(s)" in capsys.readouterr().err
    else:  # forgotten on purpose: the entry removed, a new ledger starts
        entry = Path(key_registry) / NoiseKey.load(stream["key"]).fingerprint()
        entry.unlink()
        assert main(second) == 0
        assert ledger.is_file()


@pytest.mark.parametrize("how", ["cp", "mv", "in place", "new path", "grown by a key"])
def test_a_ledger_put_back_from_a_backup_is_refused_until_forgotten(
    tmp_path, stream, capsys, key_registry, how
):
    """Review 113 (low): a key's ledger replaced at its path by an older backup (`mv` or
    `cp` over it) forgot the runs recorded since, so a capped run passed its dataset's
    cap (and a stream recorded since could go out again under the same noise). The key
    registry keeps the size a run of the key left the ledger at and a digest of the
    bytes before it: a shorter file, or one with other bytes there, is refused in every
    command, before anything is written, until the entry is removed on purpose.
    Review 116: the backup put back at a new path (the old disk lost), and a rollback
    grown past the mark by another key's runs on a shared ledger, are refused too."""
    ledger = Path(stream["key"] + ".ledger")
    other_key = tmp_path / "other.key"
    fixed_key("operator-edges, other key").save(other_key)
    named = ["--ledger", str(ledger)]  # (the shared ledger names it for both keys)
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], *named]
    assert main([*argv, "-o", str(tmp_path / "a.jsonl")]) == 0
    backup = tmp_path / "backup.ledger"
    backup.write_bytes(ledger.read_bytes())
    assert main([*argv, "-o", str(tmp_path / "b.jsonl"), "--stream", "second"]) == 0
    newer = ledger.read_bytes()
    third = [*argv, "-o", str(tmp_path / "c.jsonl"), "--stream", "third"]
    budget = ["budget", "--key-file", stream["key"], *named]
    if how == "mv":
        backup.rename(ledger)
    elif how == "cp":
        ledger.unlink()
        ledger.write_bytes(backup.read_bytes())
    elif how == "in place":
        ledger.write_bytes(backup.read_bytes())  # the same file, shorter
    elif how == "new path":  # the recorded ledger lost, its backup put back elsewhere
        ledger.unlink()
        moved = tmp_path / "restored.ledger"
        moved.write_bytes(backup.read_bytes())
        third[third.index(str(ledger))] = str(moved)
        budget[budget.index(str(ledger))] = str(moved)
    else:  # put back, then grown past the mark by another key's runs
        ledger.write_bytes(backup.read_bytes())
        for k in range(3):
            out = str(tmp_path / f"o{k}.jsonl")
            other = [*UNK, "--key-file", str(other_key), "-i", stream["src"], "-o", out]
            assert main([*other, *named, "--stream", f"k{k}"]) == 0
        assert len(ledger.read_bytes()) > len(newer)
    capsys.readouterr()
    for command in (third, budget):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert "shorter than a run of the key left that ledger, or holds other" in err, err
        assert "remove the registry entry" in err
    assert not (tmp_path / "c.jsonl").exists()
    if how in ("new path", "grown by a key"):
        return
    # the key's own ledger put back: it goes on
    ledger.unlink()
    ledger.write_bytes(newer)
    assert main(third) == 0


def test_a_ledger_whose_device_number_changed_is_not_refused(tmp_path, stream, key_registry):
    """Review 116 (medium): a ledger's volume mounted again under another device number
    (NFS, USB, a container's volume) made every command refuse the very same file. Its
    mark is its size and the bytes before it, not its device and inode."""
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"]]
    assert main([*argv, "-o", str(tmp_path / "a.jsonl")]) == 0
    entry = Path(key_registry) / NoiseKey.load(stream["key"]).fingerprint()
    path, key_file, ids, mark = entry.read_text().splitlines()
    dev, ino, folder_dev = ids.split()
    entry.write_text(f"{path}\n{key_file}\n{int(dev) + 1} {ino} {folder_dev}\n{mark}\n")
    assert main([*argv, "-o", str(tmp_path / "b.jsonl"), "--stream", "second"]) == 0


def test_a_copy_of_a_gone_ledger_that_holds_its_releases_is_taken(tmp_path, stream, key_registry):
    """A recorded ledger that is gone, and a --ledger that holds releases (copied with
    `cp` before the original was removed): that ledger knows them, and is recorded."""
    out = tmp_path / "o.jsonl"
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]
    assert main(argv) == 0
    ledger = Path(stream["key"] + ".ledger")
    backup = tmp_path / "copied.ledger"
    backup.write_bytes(ledger.read_bytes())  # another inode: not the file moved
    ledger.unlink()
    assert main(["budget", "--key-file", stream["key"], "--ledger", str(backup)]) == 0
    other = with_option(argv, "-o", str(tmp_path / "p.jsonl"))
    assert main([*other, "--ledger", str(backup)]) == 1
    assert main(with_option(argv, "-o", str(tmp_path / "q.jsonl"))) == 1  # the default


@pytest.mark.parametrize("kind", ["input", "jsonl-long", "parquet"])
def test_view_export_of_a_file_that_holds_no_release_is_refused(tmp_path, stream, capsys, kind):
    """Review 83: `view events.jsonl --export` (the run's input, an easy slip), a Parquet
    output or long rows exited 0 with a page that waited for a first release."""
    path = stream["src"]
    if kind != "input":
        out = tmp_path / ("o.jsonl" if kind == "jsonl-long" else "o.parquet")
        fmt = ["--output-format", kind] if kind == "jsonl-long" else []
        argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out), *fmt]
        assert main(with_option(argv, "--rho", "1e4")) == 0
        path = str(out)
    capsys.readouterr()
    page = tmp_path / "page.html"
    assert main(["view", path, "--export", str(page)]) == 1
    err = capsys.readouterr().err
    assert "holds no release" in err or "the view reads JSON Lines" in err
    assert not page.exists()


def test_a_missing_input_is_named_before_the_ledger_is_read(tmp_path, stream, capsys):
    """Review 83: with a scope already used, `-i nofile.jsonl` gave the ledger's long
    replay refusal instead of saying the input is missing."""
    out = tmp_path / "o.jsonl"
    assert main([*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]) == 0
    capsys.readouterr()
    missing = str(tmp_path / "nofile.jsonl")
    argv = [*UNK, "--key-file", stream["key"], "-i", missing, "-o", str(tmp_path / "p.jsonl")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "No such file or directory" in err and "ledger" not in err


def test_a_parameter_refusal_names_each_option_once(tmp_path, stream, capsys):
    """Review 83: a run without --horizon over a state begun with one was refused as
    differing in "..., --horizon, ..., --horizon (given or not)"."""
    argv = [*UNK[:-2], "--key-file", stream["key"], "-i", stream["src"], "-o",
            str(tmp_path / "o.jsonl"), "--state", str(tmp_path / "s.sqlite")]  # fmt: skip
    assert main([*argv, "-T", "3", "--until", "2"]) == 0
    capsys.readouterr()
    assert main([*argv, "--until", "3"]) == 1
    err = capsys.readouterr().err
    differs = err.split("differs in: ")[1].split("): refusing")[0]
    assert differs.count("--horizon") == 1, differs


def test_a_chain_of_too_many_links_is_refused(tmp_path, stream, capsys):
    """Review 85: past the walk's limit the path was let through; past 40 links it is
    refused, as the kernel's ELOOP."""
    (tmp_path / "end").mkdir()
    prev = tmp_path / "end"
    for k in range(45):
        link = tmp_path / f"l{k}"
        os.symlink(prev, link)
        prev = link
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(prev / "o.jsonl")]
    assert main(argv) == 1
    assert "too many symbolic links" in capsys.readouterr().err


def test_an_absolute_output_runs_from_a_removed_working_folder(tmp_path, stream, monkeypatch):
    """Review 85: the link walk read the working folder even for an absolute path, so a
    run from a removed folder failed with "[Errno 2]" naming no file."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    out = tmp_path / "o.jsonl"
    assert main([*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]) == 0


def test_lateness_without_follow_warns_through_the_run_s_log(tmp_path, stream, capsys):
    """Reviews 83-85: --lateness without --follow changes nothing and warns (a stream
    begun with it goes on with it), in the log format asked for."""
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o",
            str(tmp_path / "o.jsonl"), "--lateness", "5m", "--log-format", "json"]  # fmt: skip
    assert main(argv) == 0
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert any("without --follow it changes nothing" in str(x) for x in lines)


@pytest.mark.parametrize("folder", ["not sticky", "group"])
def test_a_link_another_user_made_where_the_kernel_would_follow_it_is_refused(
    tmp_path, stream, capsys, folder
):
    """Review 103 and 104: only sticky shared folders were checked (the kernel's own rule,
    off on some machines): a link of another user in a folder all may write without the
    sticky bit, or in a group-writable one, led the output where that user chose."""
    link, planted = _foreign_link(tmp_path, "rel.jsonl")
    os.chmod(link.parent, 0o777 if folder == "not sticky" else 0o2775)  # (a team's folder)
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(link)]
    assert main(argv) == 1
    assert "symbolic link another user made" in capsys.readouterr().err
    assert not list(planted.parent.iterdir())


def test_the_ledger_is_not_opened_through_another_users_link(tmp_path, stream, capsys):
    """Review 103: the ledger path was not checked at all: a link planted beside a new
    key made the run create its ledger where another user chose (who could then roll
    it back)."""
    link, planted = _foreign_link(tmp_path, "led")
    out = tmp_path / "o.jsonl"
    argv = [*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]
    assert main([*argv, "--ledger", str(link)]) == 1
    assert "the release ledger" in capsys.readouterr().err
    assert not list(planted.parent.iterdir()) and not out.exists()


def test_reproduce_does_not_write_its_report_through_another_users_link(tmp_path, capsys):
    """Review 103: `dpstream reproduce --out DIR` wrote REPORT.md (and its figures)
    through a link another user planted in DIR, over a file that user chose."""
    from pathlib import Path

    from dpstream.experiments.common import save_figure
    from dpstream.experiments.report import refuse_foreign_link

    link, planted = _foreign_link(tmp_path, "REPORT.md")
    with pytest.raises(ValueError, match="symbolic link another user made"):
        refuse_foreign_link(str(link), "--out")
    (tmp_path / "f").mkdir()
    fig_link, fig_planted = _foreign_link(tmp_path / "f", "fig.png")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with pytest.raises(ValueError, match="symbolic link another user made"):
        save_figure(plt.figure(), Path(fig_link))
    assert not list(planted.parent.iterdir()) and not list(fig_planted.parent.iterdir())


def test_a_link_in_a_folder_of_its_owners_own_is_followed(tmp_path, stream):
    """Review 104: a deploy account's `current` link in its own folder (0755) was refused;
    that account controls the folder anyway."""
    if os.geteuid() != 0:
        pytest.skip("making a link another user owns needs root")
    app = tmp_path / "app"
    (app / "releases" / "v2").mkdir(parents=True)
    os.symlink(app / "releases" / "v2", app / "current")
    os.lchown(app / "current", 65534, 65534)
    os.chown(app, 65534, 65534)
    out = app / "current" / "o.jsonl"
    assert main([*UNK, "--key-file", stream["key"], "-i", stream["src"], "-o", str(out)]) == 0
    assert (app / "releases" / "v2" / "o.jsonl").exists()


def test_a_ledger_whose_first_line_was_closed_torn_is_still_known_as_a_ledger(tmp_path):
    """Review 104: a ledger whose torn first line was closed (an append-only ledger) was
    not known as a ledger, so another run's --output --force overwrote it."""
    from dpstream.run.output import _what_else

    for head in (b"S\x00" + b"0" * 32 + b"\nS1 x y z\n", b"L1 a 1 b c d\n"):
        path = tmp_path / "led"
        path.write_bytes(head)
        assert _what_else(str(path)) == "a release ledger"
    key = tmp_path / "k2.hex"
    key.write_text("ab" * 30 + "\n" + "ab" * 2 + "\n")  # a key file on two lines (xxd -p)
    assert _what_else(str(key)) == "a secret key file"


def test_a_missing_output_on_resume_is_refused_before_its_sidecar_is_written(
    tmp_path, stream, capsys
):
    """Review 102: the next batch of a stream whose output was deleted rewrote the
    output's sidecar, then refused because the output was missing."""
    out, state = tmp_path / "rel.jsonl", tmp_path / "st.db"
    first = tmp_path / "day1.jsonl"
    first.write_text("".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in (1, 2)))
    base = [*UNK, "--key-file", stream["key"], "-o", str(out), "--state", str(state)]
    assert main([*base, "-i", str(first), "--until", "2"]) == 0
    sidecar = tmp_path / "rel.jsonl.meta.json"
    sidecar.write_text('{"marker": true}\n')  # any change to it shows
    before = os.stat(sidecar).st_mtime_ns
    out.unlink()
    capsys.readouterr()
    second = tmp_path / "day2.jsonl"
    second.write_text(json.dumps({"t": 3, "items": ["a"]}) + "\n")
    assert main([*base, "-i", str(second), "--until", "3"]) == 1
    assert "is missing" in capsys.readouterr().err
    assert sidecar.read_text() == '{"marker": true}\n'
    assert os.stat(sidecar).st_mtime_ns == before
    assert not out.exists()


def test_a_record_s_own_text_never_names_its_reason_or_lifts_the_redaction(
    tmp_path, stream, capsys
):
    """Review 111: the reason of an invalid record was searched for in its whole message,
    quoted content included: an item {"timestamp": ...} made it a timestamp's (a reason
    shown whole), so `--on-invalid error` printed the item without --verbose-errors, and
    a "t" of "x past the horizon" was counted as past the horizon."""
    src = tmp_path / "leak.jsonl"
    src.write_text(
        '{"t": 1, "items": ["a"]}\n'
        '{"t": 1, "items": [{"timestamp": "2026-03-01", "drug": "HIV-med"}]}\n'
        '{"t": "x past the horizon", "items": ["a"]}\n'
    )
    base = [*UNK, "--key-file", stream["key"], "-i", str(src)]
    assert main([*base, "-o", str(tmp_path / "e.jsonl"), "--on-invalid", "error"]) == 1
    err = capsys.readouterr().err
    assert "HIV" not in err and "drug" not in err, err
    assert "input line 2: not a valid event (--verbose-errors shows" in err
    out = tmp_path / "s.jsonl"
    assert main([*base, "-o", str(out), "--max-invalid", "1"]) == 0
    reasons = [x for x in capsys.readouterr().err.splitlines() if "by reason" in x]
    assert len(reasons) == 1 and "2 malformed" in reasons[0], reasons
    assert "timestamp" not in reasons[0] and "horizon" not in reasons[0]


def test_a_backlog_piped_to_a_follow_run_is_named_late_in_a_warning(tmp_path, stream):
    """Review 111: a backlog piped in (`cat old.jsonl | dpstream run --follow -i -`) whose
    steps were all due at the start released them empty, said "0 events, 0 skipped",
    and ended: nothing told the operator that a pipe's events of due steps are late."""
    events = "".join(
        json.dumps({"ts": f"2026-03-01T0{h}:1{j}:00Z", "items": ["a"]}) + "\n"
        for h in range(2)
        for j in range(3)
    )
    argv = [sys.executable, "-m", "dpstream", *UNK[:-2], "-T", "2", "--key-file", stream["key"],
            "--time-field", "ts", "--step", "1h", "--start", "2026-03-01T00:00Z", "--follow",
            "-i", "-", "-o", str(tmp_path / "o.jsonl")]  # fmt: skip
    done = subprocess.run(argv, input=events.encode(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    assert "count no event read from a pipe" in err and "Give a backlog as a file" in err
