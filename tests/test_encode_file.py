"""`Tokenizer.encode_file_to_npy` and `tokenmill tokenizer encode --input --output`: the file
is cut at safe points and encoded in blocks, with the ids of the whole text, in flat memory."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.cli import main
from pipeline_lib import bpe_reference as ref
from pipeline_lib.tokenizer import Tokenizer, get_encoding
from pipeline_lib.tokenizer.core import safe_cuts

ENCODINGS = {"gpt2": "gpt2", "cl100k": "cl100k_base", "o200k": "o200k_base"}
# the characters the split patterns treat apart: newlines, other spaces, letters of each case,
# digits, punctuation, marks, contractions
ALPHABET = st.sampled_from(
    ["\n", "\r", " ", "\t", "\u00a0", "\u2028", "\x85", "a", "B", "é", "Ω", "日", "1", "7", ".", "'", "s", "<", "/"]
    + ["\u0301", "🙂", "\n\n", " \n", "}\n//", "'ll"]
)
TEXTS = st.lists(ALPHABET, max_size=60).map("".join)


@settings(max_examples=1500, deadline=None)
@given(text=TEXTS, pattern=st.sampled_from(sorted(ENCODINGS)))
def test_the_pieces_of_a_text_are_those_of_its_blocks(text, pattern):
    """Cut at every safe point, the blocks split (with the core and the regex) into exactly
    the whole text's pieces: so they encode to its ids."""
    data = text.encode()
    bounds = [0, *safe_cuts(data, pattern), len(data)]
    blocks = [data[a:b] for a, b in zip(bounds, bounds[1:])]
    whole = ref.split_bytes(data, pattern)
    assert [p for b in blocks for p in ref.split_bytes(b, pattern)] == whole
    tok = get_encoding(ENCODINGS[pattern])
    assert [p for b in blocks for p in tok._split(b)] == tok._split(data) == whole


BLOCK_TEXTS = st.lists(
    st.sampled_from(["ab", "x\n", "y\r\n", "\n", " ", "é", "z" * 40, "/"]), min_size=10, max_size=120
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=BLOCK_TEXTS, round_bytes=st.integers(1, 64), pattern=st.sampled_from(sorted(ENCODINGS)))
def test_the_blocks_of_a_file_are_the_file_cut_at_safe_points(tmp_path_factory, text, round_bytes, pattern):
    """`_safe_blocks` (two buffers taken in turn): the blocks put together are the file, each ends
    at a safe cut or at the end, and a block is intact while the next one is read, as the
    command uses them (it encodes a block while the next is read)."""
    from pipeline_lib.tokenizer.core import _SAFE_CUTS, _safe_blocks

    data = text.encode()
    path = tmp_path_factory.mktemp("blocks") / "f.txt"
    path.write_bytes(data)
    cuts = set(safe_cuts(data, pattern))
    got: list[bytes] = []
    with open(path, "rb") as f:
        blocks = _safe_blocks(f, round_bytes, _SAFE_CUTS[pattern])
        held = next(blocks, None)
        while held is not None:
            before = bytes(held)
            following = next(blocks, None)  # read while `held` is in use
            assert bytes(held) == before
            got.append(before)
            held = following
    assert b"".join(got) == data
    ends = list(np.cumsum([len(b) for b in got]))
    assert all(e in cuts for e in ends[:-1]) and all(len(b) > 0 for b in got)


def test_where_each_pattern_may_be_cut():
    assert safe_cuts(b"ab\r\ncd\nef", "cl100k") == [4, 7]
    assert safe_cuts(b"ab\r\ncd\nef", "gpt2") == [7]  # GPT-2's pattern: "\r", "\n" in the text, "\r\n" at its end
    # paragraphs: a blank line ends a piece before a letter, but not with GPT-2's pattern
    assert safe_cuts(b"a\n\nb a\n b", "o200k") == safe_cuts(b"a\n\nb a\n b", "cl100k") == [3]
    assert safe_cuts(b"a\n\nb a\n b", "gpt2") == []
    # o200k's punctuation pieces take the newlines and slashes after them: "}\n//" is one piece
    assert safe_cuts(b"}\n// c\nx", "o200k") == [7] and safe_cuts(b"}\n// c\nx", "cl100k") == [2, 7]


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base", "gpt2"])
@pytest.mark.parametrize("round_bytes", [100, 4096, 16 << 20])
def test_the_file_encodes_as_the_whole_text(tmp_path, multilingual_text, name, round_bytes):
    tok = get_encoding(name)
    raw = (multilingual_text[:30_000] + "\r\nbad \xff\xfe bytes\nend <|endoftext|> x\n" + "y" * 5000).encode(
        "utf-8", "surrogateescape"
    )
    raw = raw.replace("\xff\xfe".encode(), b"\xff\xfe")
    path, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    path.write_bytes(raw)
    text = raw.decode("utf-8", "surrogateescape")
    n = tok.encode_file_to_npy(str(path), str(out), round_bytes=round_bytes, num_threads=2)
    expected = tok.encode_to_numpy(text, disallowed_special=())
    got = np.load(out, allow_pickle=False)
    assert got.dtype == np.uint32 and n == len(got)
    assert np.array_equal(got, expected)
    n = tok.encode_file_to_npy(str(path), str(out), allowed_special="all", round_bytes=round_bytes, num_threads=2)
    assert np.array_equal(np.load(out), tok.encode_to_numpy(text, allowed_special="all"))
    assert tok.special_tokens["<|endoftext|>"] in np.load(out)


def test_an_empty_file_gives_an_empty_array(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    assert get_encoding("cl100k_base").encode_file_to_npy(str(tmp_path / "empty.txt"), str(tmp_path / "ids.npy")) == 0
    assert np.load(tmp_path / "ids.npy").shape == (0,)


def test_the_command_streams_and_keeps_its_errors(tmp_path, multilingual_text, capsys):
    saved = str(tmp_path / "tok")
    get_encoding("cl100k_base").save(saved)
    path = tmp_path / "in.txt"
    path.write_text(multilingual_text + "a <|endoftext|> b\n", encoding="utf-8")
    assert (
        main(
            [
                "tokenizer",
                "encode",
                "--tokenizer",
                saved,
                "--input",
                str(path),
                "--output",
                str(tmp_path / "ids"),
                "--allow-special",
                "all",
            ]
        )
        == 0
    )
    tok = get_encoding("cl100k_base")
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(path.read_text(encoding="utf-8"), allowed_special="all")
    assert (
        main(["tokenizer", "encode", "--tokenizer", saved, "--input", str(path), "--output", str(tmp_path / "ids.npy")])
        == 2
    )
    assert "--special-as-text" in capsys.readouterr().err
    assert (
        main(
            [
                "tokenizer",
                "encode",
                "--tokenizer",
                saved,
                "--input",
                str(path),
                "--special-as-text",
                "--output",
                str(tmp_path / "no" / "ids.npy"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--output" in err[0] and "no such directory" in err[0], err


PEAK_RSS = """
import resource, sys
from pipeline_lib.tokenizer import get_encoding
tok = get_encoding("cl100k_base")
tok.encode_ordinary("warm up")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tok.encode_file_to_npy(sys.argv[1], sys.argv[2], round_bytes=1 << 20, num_threads=2)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_peak_memory_does_not_grow_with_the_file(tmp_path, multilingual_text):
    """Peak RSS (KiB) over the tokenizer's own, for a file and one four times as large."""
    block = multilingual_text.encode()
    growth = []
    for copies in (40, 160):  # ~9 MB and ~35 MB
        path = tmp_path / f"in{copies}.txt"
        with open(path, "wb") as f:
            for _ in range(copies):
                f.write(block)
        result = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, str(path), str(tmp_path / "ids.npy")],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ,
        )
        growth.append(int(result.stdout.strip()))
    small_bytes = 40 * len(block)
    # the large file is 3 x small_bytes longer; a whole-text read would add ~ 3 x small_bytes
    assert growth[1] - growth[0] < 0.1 * 3 * small_bytes / 1024, growth


@pytest.mark.parametrize("window", [1, 3, 1 << 20])
def test_utf8_is_checked_a_window_at_a_time(window):
    from pipeline_lib.tokenizer.core import _is_utf8

    good = "héllo\nwörld 🙂\nend\n".encode()
    assert _is_utf8(good, window) and _is_utf8(b"ascii\nonly", window) and _is_utf8(b"", window)
    assert not _is_utf8(good + b"tail \xff\n", window)
    assert not _is_utf8(b"\xc3\nx", window)  # a sequence cut by the newline
    assert not _is_utf8(good[:-3] + "🙂".encode()[:2], window)


def test_a_failed_encode_leaves_the_output_as_it_was(tmp_path, multilingual_text, monkeypatch):
    """The ids take the output's name only once whole: a failure half-way (here the second
    block) leaves the file that was there, and no temp file beside it."""
    path, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    path.write_text(multilingual_text[:20_000], encoding="utf-8")
    np.save(out, np.arange(3, dtype=np.uint32))
    tok = get_encoding("cl100k_base")
    real, calls = tok._encode_block, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(tok, "_encode_block", failing)
    with pytest.raises(OSError):
        tok.encode_file_to_npy(str(path), str(out), round_bytes=1000, num_threads=2)
    assert len(calls) == 2
    assert np.load(out).tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.npy", "in.txt"]


def test_the_command_says_when_the_output_disk_is_full(tmp_path, multilingual_text, monkeypatch, capsys):
    path = tmp_path / "in.txt"
    path.write_text(multilingual_text[:20_000], encoding="utf-8")

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Tokenizer, "_encode_block", disk_full)
    argv = ["tokenizer", "encode", "--tokenizer", "cl100k_base", "--input", str(path), "--output", str(tmp_path / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--output" in err[0] and "no space left" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def _takes_o_direct(directory) -> bool:
    """Whether a file in `directory` can be opened with O_DIRECT (the file system takes it)."""
    try:
        fd = os.open(directory / "probe", os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(directory / "probe")
    return hasattr(os, "O_DIRECT")


@pytest.mark.parametrize("direct", [True, False])
def test_the_ids_go_to_the_file_in_whole_pages_as_the_blocks_come(tmp_path, multilingual_text, monkeypatch, direct):
    """The writer thread writes the pages that each block's ids complete: with O_DIRECT where the
    file system takes it (whole pages, at page offsets, from page-aligned buffers); through the
    page cache otherwise, each block's pages flushed to the disk as written, so that the file's
    final fsync has little left to wait for. Then the last bytes and the header. The ids in the
    file are those of the whole text all the same."""
    from pipeline_lib.tokenizer import core

    path, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    path.write_text(multilingual_text[:60_000], encoding="utf-8")
    if not direct:
        monkeypatch.setattr(core, "_set_direct", lambda fd, on: False)
    writes: list[tuple[int, int, bool]] = []  # offset, length, with O_DIRECT
    synced: list[int] = []
    real_write, real_sync = core._pwrite_all, core._fdatasync

    def recording_write(fd: int, data: memoryview, at: int) -> None:
        writes.append((at, len(data), bool(fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0))))
        real_write(fd, data, at)

    def recording_sync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real_sync(fd)

    monkeypatch.setattr(core, "_pwrite_all", recording_write)
    monkeypatch.setattr(core, "_fdatasync", recording_sync)
    tok = get_encoding("cl100k_base")
    n = tok.encode_file_to_npy(str(path), str(out), round_bytes=8000, num_threads=2)
    assert np.load(out).tolist() == tok.encode_ordinary(path.read_text(encoding="utf-8"))
    assert n == len(np.load(out))
    pages, (tail_at, tail_len, _), (header_at, header_len, header_direct) = writes[:-2], *writes[-2:]
    assert len(pages) >= 5 and all(length > 0 and length % 4096 == 0 for _, length, _ in pages)
    assert [at for at, _, _ in pages] == [0] + [at + length for at, length, _ in pages[:-1]]
    assert pages[-1][0] + pages[-1][1] == tail_at and tail_at + tail_len == out.stat().st_size
    assert (header_at, header_len, header_direct) == (0, 128, False)
    expect_direct = direct and _takes_o_direct(tmp_path)
    assert all(d == expect_direct for _, _, d in pages)
    if expect_direct:
        assert synced == []
    else:
        assert len(synced) == len(pages) and synced == sorted(synced)


def test_a_file_system_that_refuses_a_direct_write_gets_the_page_cache(tmp_path, multilingual_text, monkeypatch):
    """O_DIRECT set, then EINVAL from a write (a file system that takes the flag but not the
    alignment): that write and those after go through the page cache, the ids unchanged."""
    from pipeline_lib.tokenizer import core

    path, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    path.write_text(multilingual_text[:40_000], encoding="utf-8")
    real_write, refused, flag = core._pwrite_all, [], {"on": False}
    synced: list[int] = []

    def setting(fd: int, on: bool) -> bool:  # the flag taken, as far as the file knows
        flag["on"] = on
        return on

    def refusing(fd: int, data: memoryview, at: int) -> None:
        if flag["on"]:
            refused.append(at)
            raise OSError(errno.EINVAL, "Invalid argument")
        real_write(fd, data, at)

    monkeypatch.setattr(core, "_set_direct", setting)
    monkeypatch.setattr(core, "_pwrite_all", refusing)
    monkeypatch.setattr(core, "_fdatasync", synced.append)
    tok = get_encoding("cl100k_base")
    tok.encode_file_to_npy(str(path), str(out), round_bytes=8000, num_threads=2)
    assert np.load(out).tolist() == tok.encode_ordinary(path.read_text(encoding="utf-8"))
    assert refused == [0] and len(synced) >= 3  # the first write refused, then the page cache's


@pytest.mark.parametrize("pattern", ["cl100k", "none"])  # streamed in blocks, and read whole (no safe cuts)
def test_encode_file_counts_the_bytes_and_characters_it_read(tmp_path, multilingual_text, pattern):
    """Counted as the blocks are read (the command printed them after reading the file again):
    a byte that is not UTF-8 counts as one character, as each becomes one U+FFFD."""
    raw = multilingual_text[:30_000].encode() + b"\nbad \xff\xfe bytes \x80 and a cut \xe2\x82\n" + b"tail\n" * 500
    path, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    path.write_bytes(raw)
    g = get_encoding("cl100k_base")
    tok = g if pattern == "cl100k" else Tokenizer(g.mergeable_ranks, pattern, {})
    got = tok.encode_file(str(path), str(out), round_bytes=4000, num_threads=2)
    data = np.frombuffer(raw, dtype=np.uint8)
    assert got.bytes == len(raw)
    assert got.characters == len(raw) - int(np.count_nonzero((data & 0xC0) == 0x80))
    assert got.ids == len(np.load(out)) == tok.encode_file_to_npy(str(path), str(tmp_path / "again.npy"))


def test_the_cores_block_call_gives_a_memoryview_and_refuses_bad_bounds():
    """`encode_ordinary_buffer_ids`, the file command's call: uint32 ids, no NumPy."""
    tok = get_encoding("cl100k_base")
    data = b"hello world\nsecond line\n"
    ids = tok._encoder.encode_ordinary_buffer_ids(data, [0, 12, len(data)], 2)
    assert isinstance(ids, memoryview) and ids.format == "I" and ids.itemsize == 4
    assert ids.tolist() == tok.encode_ordinary(data.decode())
    for bad in ([], [0, len(data) + 1], [5, 2], [-1, 3], [0, "3"]):
        with pytest.raises(ValueError, match="bounds"):
            tok._encoder.encode_ordinary_buffer_ids(data, bad, 2)
    with pytest.raises(TypeError, match="list of ints"):
        tok._encoder.encode_ordinary_buffer_ids(data, (0, 3), 2)


def test_the_cores_block_call_writes_the_ids_into_a_buffer_with_room(multilingual_text):
    """With `out`, the ids go to its start and the memoryview is of it (the file command's two
    buffers, used again block after block); with too little room they go to a buffer of their
    own; a buffer that cannot be written is refused."""
    tok = get_encoding("o200k_base")
    data = (multilingual_text[:60_000] + "English words, line after line\n" * 2000).encode()
    want = tok.encode_ordinary(data.decode())
    out = mmap.mmap(-1, 4 * len(data))
    ids = tok._encoder.encode_ordinary_buffer_ids(data, [0, len(data)], 2, out)
    assert ids.format == "I" and ids.obj is out and ids.tolist() == want
    assert np.frombuffer(out, dtype="<u4", count=len(want)).tolist() == want
    again = tok._encoder.encode_ordinary_buffer_ids(data[:40_000], [0, 40_000], 2, out)
    assert again.obj is out and again.tolist() == tok.encode_ordinary(data[:40_000].decode())
    small = bytearray(4 * (len(want) - 1))
    ids = tok._encoder.encode_ordinary_buffer_ids(data, [0, len(data)], 2, small)
    assert ids.obj is not small and ids.tolist() == want
    ids = tok._encoder.encode_ordinary_buffer_ids(data, [0, len(data)], 1, out)  # one thread's, copied there
    assert ids.obj is out and ids.tolist() == want
    with pytest.raises(TypeError, match="writable"):
        tok._encoder.encode_ordinary_buffer_ids(data, [0, len(data)], 2, bytes(4 * len(data)))


def test_the_file_command_reads_and_places_ids_in_two_buffers_each(tmp_path, monkeypatch, multilingual_text):
    """Block after block, the bytes read and the ids made go to two buffers of each, taken in turn:
    a buffer per block was its pages faulted in again (half the page faults of 139 MB)."""
    from pipeline_lib.tokenizer import core

    made = []
    fresh = core._fresh_buffer
    monkeypatch.setattr(core, "_fresh_buffer", lambda size: made.append(size) or fresh(size))
    text = (multilingual_text + "English words, line after line\n" * 6000)[:400_000]
    path, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    path.write_text(text, encoding="utf-8", newline="")
    tok = get_encoding("cl100k_base")
    n = tok.encode_file_to_npy(str(path), str(out), round_bytes=50_000, num_threads=2)
    assert np.array_equal(np.load(out), tok.encode_to_numpy(text, disallowed_special=())) and n > 0
    assert len(path.read_bytes()) // 50_000 >= 8 and len(made) == 4


def test_a_system_without_pwrite_writes_the_same_file(tmp_path, multilingual_text, monkeypatch):
    """Where `os` has no pwrite (Windows), the pages go by a seek and writes: the same ids."""
    path, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    path.write_text(multilingual_text[:40_000], encoding="utf-8")
    monkeypatch.delattr(os, "pwrite")
    tok = get_encoding("cl100k_base")
    n = tok.encode_file_to_npy(str(path), str(out), round_bytes=8000, num_threads=2)
    assert np.load(out).tolist() == tok.encode_ordinary(path.read_text(encoding="utf-8")) and n > 1000


def test_ids_that_are_not_placed_are_copied_to_the_pages(tmp_path, multilingual_text, monkeypatch):
    """A block too long for an id buffer (past `_MAX_ID_BUFFER`: a line with no safe point) gets
    its ids in a buffer of the core's own, which the pages copy after the carried bytes."""
    from pipeline_lib.tokenizer import core

    path, out = tmp_path / "in.txt", tmp_path / "ids.npy"
    path.write_text(multilingual_text[:40_000], encoding="utf-8")
    monkeypatch.setattr(core, "_MAX_ID_BUFFER", 1 << 14)  # blocks of 8000+ bytes: none placed
    tok = get_encoding("cl100k_base")
    n = tok.encode_file_to_npy(str(path), str(out), round_bytes=8000, num_threads=2)
    assert np.load(out).tolist() == tok.encode_ordinary(path.read_text(encoding="utf-8")) and n > 1000
