"""supervisor/text/redact.py in-process: which names are secret, masking text and bytes (through escape codes too),
a stream that holds back the end of a read that could still become a secret, and URLs with credentials."""

from __future__ import annotations

import base64

import pytest

from supervisor.text.redact import HOLD_SCAN_BYTES, MASK, MIN_SECRET_LEN, Redactor, looks_secret, shown_url, url_secrets

TOKEN = "tok-0123456789"
PASSWORD = "hunter22"


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["API_TOKEN", "MANAGER_TOKEN", "AWS_SECRET", "DB_PASSWORD", "FTP_PASSWD",
                                  "SSH_KEY", "api_token", "Db_Password", "CONTAINER_API_KEY",
                                  "TOKEN", "PASSWORD", "PASSWD", "SECRET", "token"])  # (bare: shown in clear)
def test_a_name_ending_like_a_secret_is_secret(name: str) -> None:
    assert looks_secret(name)


@pytest.mark.parametrize("name", ["TOKEN_FILE", "KEYBOARD", "PASSWORD_HINT_SHOWN", "PATH", "SECRETARY",
                                  "MONKEY", "CONTAINER_ID", "KEY"])
def test_a_name_that_only_contains_a_secret_word_is_not(name: str) -> None:
    assert not looks_secret(name)


# ---------------------------------------------------------------- text and bytes


def test_text_masks_every_occurrence_of_every_secret() -> None:
    red = Redactor([TOKEN, PASSWORD])
    assert red.text(f"a {TOKEN} b {PASSWORD} c {TOKEN}") == f"a {MASK} b {MASK} c {MASK}"


def test_the_longer_of_two_overlapping_secrets_is_masked_whole() -> None:
    """Longest first: masking "abcd" first would leave "efgh" of "abcdefgh" readable."""
    red = Redactor(["abcd", "abcdefgh"])
    assert red.text("x abcdefgh y abcd") == f"x {MASK} y {MASK}"
    assert red.data(b"x abcdefgh y abcd") == f"x {MASK} y {MASK}".encode()


def test_secrets_too_short_or_empty_are_never_masked() -> None:
    """A one-letter value would mask innocent text everywhere."""
    short = "y" * (MIN_SECRET_LEN - 1)
    red = Redactor(["", short])
    assert not red
    assert red.text(f"yes {short} yy") == f"yes {short} yy"
    assert Redactor(["y" * MIN_SECRET_LEN])


def test_text_without_a_secret_is_returned_unchanged() -> None:
    red = Redactor([TOKEN])
    text = "nothing to hide here"
    assert red.text(text) is text
    assert red.data(b"plain") == b"plain"


def test_bytes_are_masked_like_text() -> None:
    red = Redactor([TOKEN])
    assert red.data(f"Authorization: Bearer {TOKEN}\n".encode()) == f"Authorization: Bearer {MASK}\n".encode()


def test_a_secret_with_colour_codes_inside_is_masked_and_the_codes_kept_after_the_mask() -> None:
    red = Redactor([PASSWORD])
    coloured = b"pw=hun\x1b[1mter\x1b[0m22 end"
    masked = red.data(coloured)
    assert PASSWORD.encode() not in masked.replace(b"\x1b[1m", b"").replace(b"\x1b[0m", b"")
    assert masked == b"pw=" + MASK.encode() + b"\x1b[1m\x1b[0m end"


def test_coloured_text_without_a_secret_is_left_alone() -> None:
    red = Redactor([PASSWORD])
    coloured = b"\x1b[32m INFO\x1b[0m all good"
    assert red.data(coloured) is coloured


def test_plus_adds_secrets_and_keeps_the_old_ones() -> None:
    red = Redactor([TOKEN]).plus([PASSWORD])
    assert red.text(f"{TOKEN}/{PASSWORD}") == f"{MASK}/{MASK}"
    assert Redactor([TOKEN]).text(PASSWORD) == PASSWORD  # the original is unchanged


def test_from_environments_takes_values_of_secret_names_and_of_names_asked_for() -> None:
    envs = [{"API_TOKEN": TOKEN, "PATH": "/usr/bin"}, {"MY_VALUE": "shh-value", "HOME": "/root"}]
    red = Redactor.from_environments(envs, extra_names=["MY_VALUE"])
    assert red.text(f"{TOKEN} shh-value /usr/bin /root") == f"{MASK} {MASK} /usr/bin /root"


# ---------------------------------------------------------------- the stream


def fed(red: Redactor, chunks: list[bytes]) -> bytes:
    stream = red.stream()
    return b"".join(stream.feed(c) for c in chunks) + stream.close()


@pytest.mark.parametrize("cut", range(1, len(f"token {TOKEN} done\n")))
def test_a_secret_cut_between_two_reads_anywhere_is_masked(cut: int) -> None:
    data = f"token {TOKEN} done\n".encode()
    assert fed(Redactor([TOKEN]), [data[:cut], data[cut:]]) == f"token {MASK} done\n".encode()


def test_a_secret_written_a_byte_at_a_time_is_masked() -> None:
    data = f"[{TOKEN}]\n".encode()
    assert fed(Redactor([TOKEN]), [data[i:i + 1] for i in range(len(data))]) == f"[{MASK}]\n".encode()


def test_the_stream_passes_a_finished_line_at_once() -> None:
    stream = Redactor([TOKEN]).stream()
    assert stream.feed(b"hello tok\n") == b"hello tok\n"  # a line end: no secret spans it


def test_the_stream_holds_back_only_what_could_still_become_a_secret() -> None:
    stream = Redactor([TOKEN]).stream()
    assert stream.feed(b"abc tok-01") == b"abc "
    assert stream.feed(b"xyz") == b"tok-01xyz"  # it did not go on as the secret: released


def test_the_stream_releases_what_it_held_when_the_pipe_closes() -> None:
    stream = Redactor([TOKEN]).stream()
    assert stream.feed(b"ends with tok-") == b"ends with "
    assert stream.close() == b"tok-"
    assert stream.close() == b""


PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n"


def test_a_secret_of_several_lines_printed_a_line_a_read_is_masked_line_by_line() -> None:
    """A line end ends what the stream holds back (no secret spans one): a key of several lines, printed a line a
    write, came in reads that never held it whole. Each of its lines is a secret of its own too."""
    chunks = [line.encode() + b"\n" for line in PEM.splitlines()]
    out = fed(Redactor([PEM]), chunks)
    assert not any(line.encode() in out for line in PEM.splitlines()), out
    assert out == (f"{MASK}\n" * 4).encode()


def test_a_secret_of_several_lines_read_whole_is_one_mask() -> None:
    assert Redactor([PEM]).text(f"key: {PEM}end") == f"key: {MASK}end"


def test_a_secret_with_a_trailing_line_end_is_masked_without_it() -> None:
    """A value read from a file keeps its line end ("tok\\n"); printed without it, it was shown."""
    red = Redactor([TOKEN + "\n"])
    assert red.text(f"token={TOKEN};") == f"token={MASK};"
    assert fed(red, [f"token={TOKEN}".encode(), b";\n"]) == f"token={MASK};\n".encode()


def test_a_short_line_of_a_secret_is_not_a_secret_of_its_own() -> None:
    red = Redactor(["ab\ncdefgh"])
    assert red.text("ab cdefgh") == f"ab {MASK}"


def test_a_stream_with_no_secrets_holds_nothing_back() -> None:
    stream = Redactor().stream()
    assert stream.feed(b"tok-0") == b"tok-0"


def test_an_unfinished_escape_sequence_is_held_until_it_ends() -> None:
    stream = Redactor([PASSWORD]).stream()
    assert stream.feed(b"ok \x1b[3") == b"ok "
    assert stream.feed(b"2mgreen\n") == b"\x1b[32mgreen\n"


def test_a_secret_split_by_a_code_and_a_read_is_masked() -> None:
    assert fed(Redactor([PASSWORD]), [b"pw hunt", b"\x1b[1", b"mer22 x\n"]) == b"pw " + MASK.encode() + \
        b"\x1b[1m x\n"


def test_a_secret_split_by_a_read_is_masked_whatever_other_secrets_there_are() -> None:
    """Each secret's first letter is looked for in turn: a later letter's find (further on in the read) must not
    release the beginning of another secret found before it. It did: with two secrets, "hunter2s" | "ecret"
    went out whole."""
    red = Redactor(["hunter2secret", "s3cr3t-T0ken"])
    assert fed(red, [b"db pw=hunter2s", b"ecret tok=s3cr3t-T0ken\n"]) == b"db pw=*** tok=***\n"
    # every cut of the line, with both secrets in it
    line = b"db pw=hunter2secret tok=s3cr3t-T0ken\n"
    for cut in range(1, len(line)):
        assert fed(red, [line[:cut], line[cut:]]) == b"db pw=*** tok=***\n", cut


def test_what_is_held_never_grows_past_the_scan_window() -> None:
    red = Redactor([TOKEN])
    data = b"t" * (HOLD_SCAN_BYTES * 3)  # "t" begins the secret everywhere, but far back it cannot end as one
    assert len(data) - red.hold_from(data) <= len(TOKEN)


# ---------------------------------------------------------------- URLs


@pytest.mark.parametrize(("url", "shown"), [
    ("http://user:pw@host:8080/api", f"http://user:{MASK}@host:8080/api"),
    ("https://tok@host/", f"https://{MASK}@host/"),
    ("http://host/path?x=@y", "http://host/path?x=@y"),  # an @ after the authority is no userinfo
    ("http://host:8080/", "http://host:8080/"),
    ("not a url at all", "not a url at all"),
    ("http://a:b@c@host/", f"http://a:{MASK}@host/"),  # the last @ of the authority ends the userinfo
])
def test_shown_url_masks_the_password_only(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_url_secrets_are_the_password_the_userinfo_decoded_and_the_basic_credential() -> None:
    secrets = set(url_secrets("http://us%40er:p%3Ass@host/"))
    basic = base64.b64encode(b"us@er:p:ss").decode()
    assert secrets == {"us%40er:p%3Ass", "us@er:p:ss", "p%3Ass", "p:ss", basic}


@pytest.mark.parametrize("url", [None, "", "http://host/", "host:80"])
def test_a_url_without_credentials_has_no_secrets(url: str | None) -> None:
    assert url_secrets(url) == []


def test_a_url_password_is_masked_wherever_it_turns_up() -> None:
    red = Redactor(url_secrets("http://bot:s3cr3t-pw@manager/"))
    assert red.text("curl -u bot:s3cr3t-pw; echo s3cr3t-pw") == f"curl -u {MASK}; echo {MASK}"


@pytest.mark.parametrize("secrets", [["3f9ab8c0ffee3"], ["Bearer-abc", "c0ffee"], ["abab", "babab9"],
                                     ["xyzx", "x" * 12]])
def test_no_chunking_of_the_output_lets_a_secret_through(secrets: list[str]) -> None:
    """A read that ended right after a secret that ends with a secret's first byte (its own: "3f…e3") was cut
    inside it: its head passed on unmasked, the rest held, and neither was a whole secret to mask."""
    import random

    rng = random.Random(20261207)
    redactor = Redactor(secrets)
    alphabet = [*secrets, "key=", " ", "x", "3", "b", "\x1b[31m", "\x1b[0m", "\n", "\r"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))).encode()
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 4)))) if len(text) > 1 else []
        stream, out = redactor.stream(), b""
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            out += stream.feed(text[a:b])
        out += stream.close()
        shown = strip_codes(out)
        assert not any(secret.encode() in shown for secret in secrets), (text, cuts, out)


def strip_codes(data: bytes) -> bytes:
    from supervisor.text.ansi import strip_ansi

    return strip_ansi(data)
