"""Reading ``curio fetch-params``'s output (prover/fetchlines.py), in-process.

tests/prover/test_fetch_progress.py reads one mixed transcript; these pin the rules one at a time: a file's
row in aria2c's results table adds its size (its gid's readout) and takes it out of what is under way, files
fetched at once each count by their own gid, a file said complete and then found ok
counts once, a file fetched again after a failed check counts once (and not at all from curio's line until
complete again, a restart of the reading), a file paramfetch only found ok counts
with no bytes, the readout's units, the last ERROR kept (cut to ERROR_CHARS), undecodable bytes, and the
text the log gets. Last, the lines that say nothing moved (idle: no sign of life for the stall watch): a readout
that repeats its download's figures with no speed, the progress summary around it; and a read is life if any of
its lines is not idle.
"""

from __future__ import annotations

import time

from profilekit import parsed

from supervisor.lifecycle.hooks import OutputLife, ProgressReading, ReadsProgress
from supervisor.prover.fetchlines import ERROR_CHARS, FetchParser, FetchResult, aria2_size
from supervisor.prover.hooks import PARSERS

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def results(gid: str, path: str, status: str = "OK") -> str:
    """aria2c's results table, as it ends each download (its file named with its gid)."""
    return (f"\nDownload Results:\ngid   |stat|avg speed  |path/URI\n======+====+===========+=======\n"
            f"{gid}|{status:<4}|   0.9MiB/s|{path}\n\nStatus Legend:\n({status}):download completed.\n")


def test_aria2_sizes_in_each_unit_with_decimals() -> None:
    assert aria2_size("512", "B") == 512
    assert aria2_size("1.5", "KiB") == 1536
    assert aria2_size("57", "MiB") == 57 * MIB
    assert aria2_size("2.25", "GiB") == int(2.25 * GIB)
    assert aria2_size("1", "TiB") == 1 << 40


def test_nothing_read_is_no_reading_and_a_result_reads_progress() -> None:
    result = FetchParser().result
    assert isinstance(result, ReadsProgress)
    assert result.progress() is None
    assert parsed("paramfetch", "12/01 14:43:45 [NOTICE] Downloading 1 item(s)\n").progress() is None


def test_the_latest_readout_is_the_file_under_way() -> None:
    result = parsed("paramfetch", "[#00000a 1.0MiB/4.0MiB(25%) CN:1 DL:1MiB ETA:3s]\n"
                                  "[#00000a 3.0MiB/4.0MiB(75%) CN:1 DL:1MiB ETA:1s]\n")
    assert result.readouts == 2
    assert result.progress() == ProgressReading(3 * MIB, 3 * MIB, 0)
    assert result.in_flight == 3 * MIB and result.under_way == {"00000a": (3 * MIB, 4 * MIB)}


def test_a_complete_file_adds_its_whole_size_and_the_next_starts_at_zero() -> None:
    # The last readout before the notice is short of the file (aria2c prints a readout a second): the
    # file's size is the readout's second figure, not its first.
    result = parsed("paramfetch", "[#00000a 3.0MiB/4.0MiB(75%) CN:1 DL:1MiB ETA:1s]\n"
                                  "12/01 14:43:51 [NOTICE] Download complete: /p/a.params\n"
                                  + results("00000a", "/p/a.params"))
    assert result.progress() == ProgressReading(0, 4 * MIB, 1)
    result = parsed("paramfetch", "[#00000a 3.0MiB/4.0MiB(75%)]\n"
                                  "12/01 14:43:51 [NOTICE] Download complete: /p/a.params\n"
                                  + results("00000a", "/p/a.params") +
                                  "[#00000b 512KiB/2.0MiB(25%)]\n"
                                  "12/01 14:43:52 [NOTICE] Download complete: /p/b.params\n"
                                  + results("00000b", "/p/b.params") +
                                  "[#00000c 16KiB/8.0MiB(0%)]\n")
    assert result.progress() == ProgressReading(16 * KIB, 6 * MIB + 16 * KIB, 2)
    assert result.files == {"/p/a.params", "/p/b.params"}


def test_files_fetched_at_once_each_count_by_their_own_gid() -> None:
    # curio starts every file's aria2c at once, on its one stdout: readouts of several files come mixed, and a
    # small file done within a second has none. Its size was the latest readout's (a big file's): thrown away
    # with it after a bad check, that size came off the progress of a healthy download.
    big, small = "/p/v28-porep.params", "/p/v28-porep.vk"
    result = parsed("paramfetch",
        "[#a30a28 1.0GiB/45GiB(2%)]\n"
        "[#5e11aa 2.0MiB/8.0MiB(25%)]\n"
        "[#a30a28 2.0GiB/45GiB(4%)]\n"
        f"12/01 14:43:51 [NOTICE] Download complete: {small}\n"  # (no readout of its own: done in a second)
        + results("0f0f0f", small))
    assert result.in_flight == 2 * GIB + 2 * MIB  # each file under way by its latest readout
    assert result.completed == {small: 0}, "a size no readout gave is not known"
    assert result.progress() == ProgressReading(2 * GIB + 2 * MIB, 2 * GIB + 2 * MIB, 1)
    after = parsed("paramfetch", "[#a30a28 2.0GiB/45GiB(4%)]\n"
                   f"12/01 14:43:51 [NOTICE] Download complete: {small}\n" + results("0f0f0f", small)
                   + _MISMATCH.replace("/p/a.params", small))
    assert after.progress() == ProgressReading(2 * GIB, 2 * GIB, 0, restarts=1, thrown_bytes=0)
    done = parsed("paramfetch", "[#5e11aa 2.0MiB/8.0MiB(25%)]\n[#a30a28 44GiB/45GiB(97%)]\n"
                  f"12/01 14:50:00 [NOTICE] Download complete: {big}\n" + results("a30a28", big))
    assert done.completed == {big: 45 * GIB} and done.under_way == {"5e11aa": (2 * MIB, 8 * MIB)}
    failed = parsed("paramfetch", "[#5e11aa 2.0MiB/8.0MiB(25%)]\n" + results("5e11aa", "/p/x.vk", "ERR"))
    assert failed.under_way == {} and failed.completed == {}, "a download that failed is neither"


def test_a_download_aria2c_gave_up_leaves_what_is_under_way() -> None:
    # aria2 1.36.0 on a link under --lowest-speed-limit (measured): its ERROR lines, the file "not complete", an
    # ERR row. Its gid no longer counts as under way (it did for ever: its bytes were counted on top of the
    # cache's, whose walks see the file as it was left); the file is not complete.
    result = parsed("paramfetch",
        "[#040785 80KiB/2.8MiB(2%) CN:1 DL:7.9KiB ETA:5m56s]\n"
        "\n12/04 15:25:00 [\x1b[1;31mERROR\x1b[0m] CUID#7 - Download aborted. URI=http://127.0.0.1:18777/blob\n"
        "Exception: [AbstractCommand.cc:351] errorCode=5 URI=http://127.0.0.1:18777/blob\n"
        "  -> [DownloadCommand.cc:309] errorCode=5 Too slow Downloading speed: 10228 <= 16384(B/s), host:127.0.0.1\n"
        "\n12/04 15:25:00 [\x1b[1;32mNOTICE\x1b[0m] Download GID#040785aacd168892 not complete: /p/f2\n"
        "\nDownload Results:\ngid   |stat|avg speed  |path/URI\n======+====+===========+=======\n"
        "040785|ERR |   9.5KiB/s|/p/f2\n\nStatus Legend:\n(ERR):error occurred.\n\n"
        "aria2 will resume download if the transfer is restarted.\n")
    assert result.under_way == {} and result.completed == {} and result.files == set()
    assert result.last_error == "CUID#7 - Download aborted. URI=http://127.0.0.1:18777/blob"


def test_a_file_complete_then_found_ok_counts_once() -> None:
    result = parsed("paramfetch",
        "[#00000a 1.0MiB/1.0MiB(100%)]\n"
        "12/01 14:43:51 [NOTICE] Download complete: /p/a.params   \n"
        + results("00000a", "/p/a.params") +
        "2026-12-01T14:44:52.853Z\tINFO\tparamfetch\tparamfetch.go:229\tParameter file /p/a.params is ok\n")
    assert result.files == {"/p/a.params"}  # the notice's trailing blanks are not part of the path
    assert result.progress() == ProgressReading(0, MIB, 1)


_MISMATCH = ("2026-12-01T14:44:00.100Z\tERROR\tparamfetch\tfastparamfetch/paramfetch.go:160\tsanity checking fetched "
             "file failed, removing and retrying: checksum mismatch in param file /p/a.params, 0f1e != 9a8b\n")


def test_a_file_fetched_again_after_its_check_failed_counts_once() -> None:
    # paramfetch deletes a file whose digest mismatches and fetches it once more (shared/domain/workloads.md): its bytes
    # are not done twice, or the attempt's progress passes the files' total while one is still missing.
    result = parsed("paramfetch",
        "[#00000a 4.0MiB/4.0MiB(100%)]\n"
        "12/01 14:43:51 [NOTICE] Download complete: /p/a.params\n"
        + results("00000a", "/p/a.params") + _MISMATCH +
        "[#00000b 4.0MiB/4.0MiB(100%)]\n"
        "12/01 14:44:51 [NOTICE] Download complete: /p/a.params\n"
        + results("00000b", "/p/a.params") +
        "[#00000c 1.0MiB/2.0MiB(50%)]\n")
    assert result.completed_bytes == 4 * MIB
    assert result.progress() == ProgressReading(MIB, 5 * MIB, 1, restarts=1, thrown_bytes=4 * MIB)


def test_a_file_deleted_after_its_check_failed_is_not_done_and_is_a_restart() -> None:
    # From curio's line (lib/fastparamfetch/paramfetch.go) until aria2c completes it again, the file is not
    # done: without it the reading said the bad copy's bytes done while the file was fetched again, and the
    # restart, with the bad copy's size aria2c said, tells the progress watch what no longer counts
    # (progresswatch.py).
    result = parsed("paramfetch",
        "[#00000a 4.0MiB/4.0MiB(100%)]\n"
        "12/01 14:43:51 [NOTICE] Download complete: /p/a.params\n"
        + results("00000a", "/p/a.params") + _MISMATCH +
        "[#00000b 1.0MiB/4.0MiB(25%)]\n")
    assert result.files == set() and result.completed_bytes == 0
    assert result.progress() == ProgressReading(MIB, MIB, 0, restarts=1, thrown_bytes=4 * MIB)


def test_a_restart_before_any_readout_is_a_reading_of_its_own() -> None:
    # Without aria2c, curio's Go fetch prints no readout: when the first file it fetched fails its check, that
    # line is all there is, and the reading (None while nothing was said) hid the restart from the watch. Its
    # size was never said: no bytes are thrown away by it (the walks may know them).
    result = parsed("paramfetch", _MISMATCH)
    assert result.progress() == ProgressReading(0, 0, 0, restarts=1, thrown_bytes=0)


def test_a_mismatch_found_before_fetching_is_no_restart() -> None:
    # curio checks a file already there first, and only warns (the file stays: aria2c --continue takes it up);
    # nothing was deleted, so nothing counts again.
    result = parsed("paramfetch",
        "2026-12-01T14:40:00.000Z\tWARN\tparamfetch\tfastparamfetch/paramfetch.go:141\tchecksum mismatch in "
        "param file /p/a.params, 0f1e != 9a8b\n"
        "[#00000a 1.0MiB/4.0MiB(25%)]\n")
    assert result.progress() == ProgressReading(MIB, MIB, 0, restarts=0)


def test_a_file_only_found_ok_counts_as_a_file_with_no_bytes_downloaded() -> None:
    result = parsed("paramfetch", "INFO\tparamfetch\tParameter file /p/v28-proof.vk is ok\n"
                                  "INFO\tparamfetch\tParameter file /p/v28-proof.params is ok\n")
    assert result.progress() == ProgressReading(0, 0, 2)
    assert result.completed_bytes == 0 and result.readouts == 0


def test_the_last_error_is_kept_and_cut() -> None:
    long_uri = "x" * 500
    result = parsed("paramfetch", "12/01 14:44:00 [ERROR] CUID#7 - first\n"
                                  f"12/01 14:44:01 [ERROR] CUID#8 - Download aborted. URI={long_uri}   \n")
    assert result.last_error is not None
    assert result.last_error.startswith("CUID#8 - Download aborted. URI=xxx")
    assert len(result.last_error) == ERROR_CHARS
    assert result.problem() is None  # the exit status judges a fetch, never its lines


def test_coloured_and_undecodable_lines_are_read() -> None:
    parser = FetchParser()
    parser.feed([b"12/01 14:43:51 [\x1b[1;32mNOTICE\x1b[0m] Download complete: /p/\xff.params",
                 b"12/01 14:44:00 [\x1b[1;31mERROR\x1b[0m] bad \xfe byte",
                 b"[#00000a \x1b[1m2.0MiB\x1b[0m/4.0MiB(50%)]"])
    assert parser.result.files == {"/p/\ufffd.params"}
    assert parser.result.last_error == "bad \ufffd byte"
    assert parser.result.in_flight == 2 * MIB


def test_a_readout_needs_its_gid_and_both_figures() -> None:
    result = parsed("paramfetch", "[8.2MiB/57MiB(14%)]\n[#zz 1MiB/2MiB(50%)]\n[#00000a 1MiB(50%)]\n"
                                  "[#00000a 1.0XiB/2.0MiB(50%)]\n")
    assert result.readouts == 0 and result.progress() is None


def test_describe_says_files_bytes_and_the_last_error() -> None:
    assert FetchResult().describe() == "0 file(s) complete, 0 bytes downloaded"
    result = parsed("paramfetch", "[#00000a 1.0KiB/1.0KiB(100%)]\n"
                                  "[NOTICE] Download complete: /p/a\n"
                                  + results("00000a", "/p/a") +
                                  "[ERROR] CUID#2 - Download aborted.\n")
    assert result.describe() == "1 file(s) complete, 1024 bytes downloaded, last error: CUID#2 - Download aborted."


# ---------------------------------------------------------------- what says nothing moved


def idle(parser: FetchParser, line: str) -> bool:
    """Whether ``parser`` took ``line`` (as read from the pipe, colours and all) for one that said nothing moved."""
    before = parser.idle_lines
    parser.feed([line.encode()])
    return parser.idle_lines == before + 1


# aria2c 1.36.0 against a gateway that takes the connection and never answers (--summary-interval=2), into a pipe.
DEAD_GATEWAY_BURST = [
    "[#37ca76 0B/0B CN:1 DL:0B]",
    "[#37ca76 0B/0B CN:1 DL:0B]",
    " *** Download Progress Summary as of Mon Dec  7 21:35:09 2026 *** ",
    "=" * 79,
    "[#37ca76 0B/0B CN:1 DL:0B]",
    "FILE: /var/tmp/filecoin-proof-parameters/v28-proof-of-spacetime-fallback.params",
    "-" * 79,
    "",
]


def test_a_readout_that_repeats_its_figures_with_no_speed_says_nothing_moved() -> None:
    parser = FetchParser()
    assert all(idle(parser, line) for line in DEAD_GATEWAY_BURST)  # no size yet, nothing got: never anything
    assert parser.result.progress() is None  # (and no figure of the download: its size is not known)
    assert idle(parser, "[#37ca76 0B/0B CN:0 DL:0B]")  # (a 504, tried again: no connection held)
    # A size learnt (the gateway answered), bytes got, a speed: each is life, once; the same figures again are not.
    assert not idle(parser, "[#37ca76 0B/57MiB(0%) CN:1 DL:0B]")
    assert idle(parser, "[#37ca76 0B/57MiB(0%) CN:1 DL:0B]")
    assert not idle(parser, "[#37ca76 8.2MiB/57MiB(14%) CN:1 DL:1.0MiB ETA:48s]")
    assert not idle(parser, "[#37ca76 8.2MiB/57MiB(14%) CN:1 DL:40KiB]")  # (a speed under a figure's rounding)
    assert idle(parser, "[#37ca76 8.2MiB/57MiB(14%) CN:1 DL:0B]")
    assert idle(parser, "[#37ca76 \x1b[1m8.2MiB\x1b[0m/57MiB(14%) CN:1 DL:0B]")
    # A resumed download's first readout (a gid not seen before) with bytes got already is life: it moved from nothing.
    assert not idle(parser, "[#896ec2 8.2MiB/57MiB(14%) CN:1 DL:0B]")
    assert idle(parser, "[#896ec2 8.2MiB/57MiB(14%) CN:1 DL:0B]")
    assert parser.result.in_flight == 2 * int(8.2 * MIB)  # (the progress figures are read as before)


def test_several_downloads_on_one_line_say_nothing_only_if_none_moved() -> None:
    parser = FetchParser()
    assert not idle(parser, "[DL:0B][#00000a 1.0MiB/4.0MiB(25%)][#00000b 0B/0B]")  # a's figures are news
    assert idle(parser, "[DL:0B][#00000a 1.0MiB/4.0MiB(25%)][#00000b 0B/0B]")
    assert not idle(parser, "[DL:0B][#00000a 1.0MiB/4.0MiB(25%)][#00000b 1.0KiB/2.0MiB(0%)]")
    assert not idle(parser, "[DL:12KiB][#00000a 1.0MiB/4.0MiB(25%)][#00000b 1.0KiB/2.0MiB(0%)]")


def test_every_line_but_the_idle_ones_is_life() -> None:
    parser = FetchParser()
    lines = [
        "12/07 21:35:05 [\x1b[1;32mNOTICE\x1b[0m] Downloading 1 item(s)",
        "12/07 21:36:05 [\x1b[1;31mERROR\x1b[0m] CUID#7 - Download aborted. URI=http://127.0.0.1/f.params",
        "12/07 21:36:05 [NOTICE] Allocating disk space. Use --file-allocation=none to disable it.",
        "12/07 21:36:05 [NOTICE] Download complete: /p/a.params",
        "Download Results:", "gid   |stat|avg speed  |path/URI", "======+====+===========+==========",
        "37ca76|OK  |   0.9MiB/s|/p/a.params", "Status Legend:", "(OK):download completed.",
        "2026-12-07T21:36:06.853Z\tINFO\tparamfetch\tparamfetch.go:229\tParameter file /p/a.params is ok",
        "2026-12-07T21:35:05.306Z\tINFO\tparamfetch\tparamfetch.go:108\tFetching /p/b.params from https://gw/",
        "[#37ca76 0B/0B CN:1 DL:0B] and then some words",  # a readout with more on its line: not known, so life
        "FILE", "*** Download Progress Summary", "something no rule knows",
    ]
    assert [line for line in lines if idle(parser, line)] == []


def test_a_read_is_life_if_any_line_of_it_is() -> None:
    # The phase reads through the plugin's hook, which hands the stall watch when the output last was life.
    reader = PARSERS["paramfetch"].new_parser()
    assert isinstance(reader, OutputLife) and isinstance(reader.result, FetchResult)
    reader.feed([b"2026-12-07T21:35:05.306Z\tINFO\tparamfetch\tparamfetch.go:108\tFetching /p/b.params"])
    began = reader.life_at
    assert began is not None and reader.idle_at is None
    reader.feed([line.encode() for line in DEAD_GATEWAY_BURST])
    assert reader.life_at == began and reader.idle_at is not None and reader.idle_at >= began
    time.sleep(0.01)
    reader.feed([line.encode() for line in DEAD_GATEWAY_BURST[:4]] + [b"[#37ca76 0B/57MiB(0%) CN:1 DL:0B]"])
    assert reader.life_at is not None and reader.life_at > began  # one line of news among them: the read is life
