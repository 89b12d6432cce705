"""20 Newsgroups from local files: the bydate tarball, it extracted, and scikit-learn's .pkz cache
(built here in miniature, the way scikit-learn builds them; nothing is downloaded)."""

from __future__ import annotations

import codecs
import io
import pickle
import tarfile
from pathlib import Path

import pytest

from privpipe.data.records import DataError
from privpipe.text import corpus as corpus_module
from privpipe.text import load_corpus

GROUPS = ("sci.space", "comp.graphics", "rec.autos")  # not in sorted order: the classes must come out sorted
TRAIN_POSTS, TEST_POSTS = 3, 2


def _post(group: str, n: int) -> bytes:
    body = (f"From: someone{n}@example.org\nSubject: note {n} for {group}\nOrganization: Nowhere\n"
            f"Lines: 9\n\n"
            f"In article <{n}@example.org> other@example.org writes:\n> quoted line {n}\n"
            f"Body {n} about {group.split('.')[-1]} caf\xe9\n\nsecond paragraph {n}\n\n-- \nSignature {n}\n")
    return body.encode("latin-1")  # the posts are latin-1 bytes, as scikit-learn reads them


def _members() -> dict[str, bytes]:
    files = {}
    for split, count, first in (("train", TRAIN_POSTS, 100), ("test", TEST_POSTS, 200)):
        for g, group in enumerate(GROUPS):
            for k in range(count):
                n = first + 10 * g + k
                files[f"20news-bydate-{split}/{group}/{n}"] = _post(group, n)
    # a post that is empty once its header and quotes go: dropped, as the seed dropped it
    files["20news-bydate-train/rec.autos/199"] = b"From: x@example.org\nSubject: re\n\n> only a quote\n"
    return files


def write_newsgroups_tarball(path: Path) -> Path:
    """A miniature ``20news-bydate.tar.gz``: top folders train/test, one folder per group, one file per post."""
    with tarfile.open(path, "w:gz") as archive:
        for name, data in _members().items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def write_newsgroups_cache(home: Path, tarball: Path) -> Path:
    """scikit-learn's cache for ``tarball``, written as ``_download_20newsgroups`` writes it."""
    from sklearn.datasets import load_files

    extracted = home / "20news_home"
    with tarfile.open(tarball) as archive:
        archive.extractall(extracted, filter="data")
    cache = dict(train=load_files(extracted / "20news-bydate-train", encoding="latin1"),
                 test=load_files(extracted / "20news-bydate-test", encoding="latin1"))
    path = home / "20news-bydate_py3.pkz"
    path.write_bytes(codecs.encode(pickle.dumps(cache), "zlib_codec"))
    return path


def _load(path, download: bool = False):
    return load_corpus(path, format="20newsgroups", text_column="text", label_column="label", client_column=None,
                       split_column=None, test_fraction=0.2, seed=0, download=download)


@pytest.fixture()
def sources(tmp_path):
    tarball = write_newsgroups_tarball(tmp_path / "20news-bydate.tar.gz")
    home = tmp_path / "home"
    home.mkdir()
    cache = write_newsgroups_cache(home, tarball)
    return tarball, cache, home


def test_tarball_gives_sorted_classes_split_sizes_stable_ids_and_stripped_texts(sources):
    tarball, _, _ = sources
    corpus = _load(tarball)
    assert corpus.classes == ("comp.graphics", "rec.autos", "sci.space")
    assert (len(corpus.train), len(corpus.test)) == (9, 6)  # the empty post is gone
    assert "train/rec.autos/199" not in corpus.train.ids
    assert corpus.train.ids[0] == "train/comp.graphics/110" and corpus.test.ids[-1] == "test/sci.space/201"
    assert corpus.source == str(tarball)
    for texts, labels, ids in ((corpus.train.texts, corpus.train.labels, corpus.train.ids),
                               (corpus.test.texts, corpus.test.labels, corpus.test.ids)):
        for text, label, record in zip(texts, labels, ids):
            group = record.split("/")[1]
            assert corpus.classes[label] == group
            n = record.split("/")[2]
            assert f"Body {n} about {group.split('.')[-1]} caf\u00e9" in text  # latin-1 decoded
            assert f"second paragraph {n}" in text
            for gone in ("From:", "Subject:", "Organization:", "writes:", "> quoted", "Signature"):
                assert gone not in text


def test_extracted_folder_cache_and_data_home_read_the_same_corpus(sources, tmp_path):
    tarball, cache, home = sources
    reference = _load(tarball)
    for path in (cache, home, home / "20news_home", tmp_path):  # tmp_path holds the tarball
        corpus = _load(path)
        assert corpus.classes == reference.classes
        for split in ("train", "test"):
            mine, theirs = getattr(corpus, split), getattr(reference, split)
            assert mine.texts == theirs.texts
            assert mine.ids.tolist() == theirs.ids.tolist()
            assert mine.labels.tolist() == theirs.labels.tolist()


def test_same_texts_as_scikit_learns_own_loader(sources):
    from sklearn.datasets import fetch_20newsgroups

    _, _, home = sources
    corpus = _load(home)
    for split in ("train", "test"):
        bunch = fetch_20newsgroups(data_home=str(home), subset=split, shuffle=False, download_if_missing=False,
                                   remove=("headers", "footers", "quotes"))
        theirs = {f"{split}/{Path(f).parent.name}/{Path(f).name}": t for f, t in zip(bunch.filenames, bunch.data)
                  if t.strip()}
        mine = getattr(corpus, split)
        assert dict(zip(mine.ids.tolist(), mine.texts)) == theirs


def test_empty_path_reads_scikit_learns_data_home(sources, monkeypatch):
    _, cache, home = sources
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(home))
    corpus = _load("")
    assert corpus.source == str(cache) and len(corpus.train) == 9


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.tar.gz",
     r"missing.tar.gz: not found \(text.path: the 20news-bydate.tar.gz tarball, .*text.download: true"),
    (lambda d: d,
     r": no 20news-bydate_py3.pkz, 20news-bydate.tar.gz or 20news-bydate-train/ and 20news-bydate-test/ in this "
     r"folder \(text.path: "),
    (lambda d: _write(d / "texts.jsonl", b'{"text": "a", "label": "x"}\n'),
     r"texts.jsonl: neither a tarball nor a .pkz cache \(text.path: "),
    (lambda d: _write(d / "20news-bydate_py3.pkz", b"not zlib"),
     r"20news-bydate_py3.pkz: not a readable scikit-learn 20 Newsgroups cache \(error: .*\(text.path: "),
    (lambda d: _write(d / "20news-bydate.tar.gz", b"\x1f\x8b truncated"),
     r"20news-bydate.tar.gz: neither a tarball nor a .pkz cache"),
])
def test_a_path_with_nothing_usable_is_one_line_naming_it(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(DataError, match=message) as caught:
        _load(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_a_tarball_without_the_bydate_folders_is_refused(tmp_path):
    path = tmp_path / "other.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("posts/sci.space/1")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(DataError, match=r"other.tar.gz: no posts under 20news-bydate-train/<newsgroup>/"):
        _load(path)


def test_fallback_strippers_match_scikit_learns():
    from sklearn.datasets import _twenty_newsgroups as sk

    texts = [data.decode("latin-1") for data in _members().values()] + ["", "\n\n", "no header at all", "a\n--\n"]
    for text in texts:
        assert corpus_module._strip_header(text) == sk.strip_newsgroup_header(text)
        assert corpus_module._strip_footer(text) == sk.strip_newsgroup_footer(text)
        assert corpus_module._strip_quoting(text) == sk.strip_newsgroup_quoting(text)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
