"""Registry: one DatasetSpec per named dataset (where to get it, how to check it, how to read it,
which protocol the paper or the thesis applies to it).

Checksums are the published ones where the publisher gives one (GroupLens: MD5 beside each zip).
Where none is published the spec says so (`md5 = sha256 = None`) and the SHA-256 seen at download
time is recorded in `<root>/raw/<name>/download.json` and in every prepared manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from vaecf.errors import DataError


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch."""

    url: str  # official address
    filename: str  # name it is stored under in <root>/raw/<name>/
    md5: str | None = None  # published MD5 (hex), None when the publisher gives none
    sha256: str | None = None  # published SHA-256 (hex), None when the publisher gives none
    size: int | None = None  # bytes, when known (shown before downloading)


@dataclass(frozen=True)
class DatasetSpec:
    """Everything vaecf knows about a named dataset."""

    name: str  # registry key, e.g. "ml-20m"
    title: str  # human name
    parser: str  # key into vaecf.data.parsers.PARSERS
    raw_files: tuple[str, ...]  # file names (or glob patterns) the parser reads
    files: tuple[RemoteFile, ...] = ()  # what `vaecf download` fetches; () = manual only
    defaults: dict = field(default_factory=dict)  # PrepareSettings fields for its protocol
    homepage: str = ""  # where the dataset is described
    licence: str = ""  # the terms as the dataset states them (summary)
    size: str = ""  # download size and row count
    manual: str = ""  # how to get the files when there is no download
    notes: str = ""  # format details worth knowing
    known: dict = field(default_factory=dict)  # published figures (raw and after preprocessing)
    # item names: a file beside the raw files (read when present, see parsers.NAMES_READERS), or
    # "inline" (the parser's names=True adds a name column); "" = none
    names: str = ""


def _grouplens(name: str, md5: str | None, size: int | None) -> tuple[RemoteFile, ...]:
    url = f"https://files.grouplens.org/datasets/movielens/{name}.zip"
    return (RemoteFile(url, f"{name}.zip", md5=md5, size=size),)


_ML_LICENCE = (
    "GroupLens research licence: research use only, no redistribution without permission, "
    "cite Harper & Konstan (2015), no commercial use without permission."
)
# the paper keeps ratings > 3.5; on half-star (and integer) scales that is >= 4
_ML_LIANG = dict(min_rating=4.0, min_user_items=5, min_item_users=0, protocol="liang")
_THESIS = dict(protocol="thesis", validation_frac=0.07, test_frac=0.07)

SPECS: dict[str, DatasetSpec] = {}


def _add(spec: DatasetSpec) -> None:
    SPECS[spec.name] = spec


_add(
    DatasetSpec(
        name="ml-20m",
        names="movies.csv",
        title="MovieLens 20M",
        parser="movielens-csv",
        raw_files=("ratings.csv",),
        files=_grouplens("ml-20m", "cd245b17a1ae2cc31bb14903e1204af3", None),
        defaults={**_ML_LIANG, "heldout_users": 10_000},
        homepage="https://grouplens.org/datasets/movielens/20m/",
        licence=_ML_LICENCE,
        size="190 MB zip; 20,000,263 ratings by 138,493 users on 26,744 movies",
        notes="ratings.csv: header userId,movieId,rating,timestamp; half-star ratings 0.5-5.",
        known={
            "raw_ratings": 20_000_263,
            "raw_users": 138_493,
            "paper_train_users": 136_677,
            "paper_items": 20_108,
            "paper_heldout_users": 10_000,
        },
    )
)
_add(
    DatasetSpec(
        name="ml-1m",
        names="movies.dat",
        title="MovieLens 1M",
        parser="movielens-dat",
        raw_files=("ratings.dat",),
        files=_grouplens("ml-1m", "c4d9eecfca2ab87c1945afe126590906", None),
        defaults={**_ML_LIANG, **_THESIS},
        homepage="https://grouplens.org/datasets/movielens/1m/",
        licence=_ML_LICENCE,
        size="6 MB zip; 1,000,209 ratings by 6,040 users on 3,706 movies",
        notes="ratings.dat: UserID::MovieID::Rating::Timestamp, no header, integer stars 1-5.",
        known={"raw_ratings": 1_000_209, "raw_users": 6_040},
    )
)
_add(
    DatasetSpec(
        name="ml-25m",
        names="movies.csv",
        title="MovieLens 25M",
        parser="movielens-csv",
        raw_files=("ratings.csv",),
        files=_grouplens("ml-25m", "6b51fb2759a8657d3bfcbfc42b592ada", None),
        defaults={**_ML_LIANG, **_THESIS},
        homepage="https://grouplens.org/datasets/movielens/25m/",
        licence=_ML_LICENCE,
        size="250 MB zip; 25,000,095 ratings by 162,541 users on 59,047 movies",
        notes="Same ratings.csv format as ml-20m.",
        known={"raw_ratings": 25_000_095, "raw_users": 162_541},
    )
)
_add(
    DatasetSpec(
        name="ml-32m",
        names="movies.csv",
        title="MovieLens 32M",
        parser="movielens-csv",
        raw_files=("ratings.csv",),
        files=_grouplens("ml-32m", "d472be332d4daa821edc399621853b57", None),
        defaults={**_ML_LIANG, **_THESIS},
        homepage="https://grouplens.org/datasets/movielens/32m/",
        licence=_ML_LICENCE,
        size="240 MB zip; 32,000,204 ratings by 200,948 users on 84,432 movies",
        notes="Same ratings.csv format as ml-20m.",
        known={"raw_ratings": 32_000_204, "raw_users": 200_948},
    )
)
_add(
    DatasetSpec(
        name="ml-latest-small",
        names="movies.csv",
        title="MovieLens latest (small)",
        parser="movielens-csv",
        raw_files=("ratings.csv",),
        files=_grouplens("ml-latest-small", None, None),
        defaults={**_ML_LIANG, **_THESIS},
        homepage="https://grouplens.org/datasets/movielens/latest/",
        licence=_ML_LICENCE + " 'latest' files change over time: the SHA-256 seen is recorded.",
        size="1 MB zip; about 100,000 ratings by 610 users",
        notes="Same ratings.csv format as ml-20m; no checksum is published.",
    )
)
_add(
    DatasetSpec(
        name="netflix",
        title="Netflix Prize",
        parser="netflix",
        raw_files=("mv_*.txt", "combined_data_*.txt"),
        defaults=dict(
            min_rating=4.0,
            min_user_items=5,
            min_item_users=0,
            protocol="liang",
            heldout_users=40_000,
        ),
        homepage="https://www.netflixprize.com/",
        licence="Netflix Prize rules: non-commercial research use; Netflix no longer distributes "
        "the data.",
        size="100,480,507 ratings by 480,189 users on 17,770 movies (2 GB unpacked)",
        manual="Not hosted officially any more. Pass --source to the Prize archive's "
        "training_set.tar (or nf_prize_dataset.tar.gz), the directory of mv_*.txt files, or the "
        "directory holding the four combined_data_*.txt files (the widespread re-packaging).",
        notes="Each mv_*.txt: a 'MovieID:' line, then CustomerID,Rating,Date rows; "
        "combined_data_*.txt "
        "concatenate the same blocks. Both layouts give the same rows in the same order.",
        known={
            "raw_ratings": 100_480_507,
            "raw_users": 480_189,
            "paper_heldout_users": 40_000,
            "paper_users": 463_435,
            "paper_items": 17_769,
        },
    )
)
_add(
    DatasetSpec(
        name="lastfm-360k",
        names="inline",
        title="Last.fm 360K (Celma)",
        parser="lastfm",
        raw_files=("usersha1-artmbid-artname-plays.tsv",),
        files=(
            RemoteFile(
                "http://mtg.upf.edu/static/datasets/last.fm/lastfm-dataset-360K.tar.gz",
                "lastfm-dataset-360K.tar.gz",
            ),
        ),
        defaults=dict(min_rating=1.0, min_user_items=5, min_item_users=0, **_THESIS),  # plays > 0
        homepage="https://www.upf.edu/web/mtg/lastfm360k",
        licence="Released by Oscar Celma for non-commercial research; cite 'Music Recommendation "
        "and Discovery in the Long Tail' (Springer, 2010); Last.fm's API terms apply.",
        size="543 MB tar.gz; 17,559,530 (user, artist, plays) rows by 359,347 users",
        notes="Tab-separated user sha1, artist MBID, artist name, plays; no header, no quoting. "
        "Rows "
        "with plays > 0 are positives. An artist is identified by its MBID; where the MBID is "
        "empty, by 'name:' + the artist name exactly as written (so a few artists appear twice). "
        "Malformed rows (wrong field count, bad plays) are skipped and counted in the manifest.",
    )
)
_add(
    DatasetSpec(
        name="pinterest",
        title="Pinterest (NCF, He et al. 2017)",
        parser="pinterest",
        raw_files=("pinterest-20.train.rating", "pinterest-20.test.rating"),
        files=tuple(
            RemoteFile(
                "https://raw.githubusercontent.com/hexiangnan/neural_collaborative_filtering/"
                f"master/Data/pinterest-20.{part}.rating",
                f"pinterest-20.{part}.rating",
            )
            for part in ("train", "test")
        ),
        defaults=dict(min_rating=None, min_user_items=5, min_item_users=0, **_THESIS),
        homepage="https://github.com/hexiangnan/neural_collaborative_filtering",
        licence="As distributed with the NCF code (Apache-2.0 repository); the underlying data is "
        "from Geng et al. (ICCV 2015), for research use.",
        size="1,500,809 interactions by 55,187 users on 9,916 pins",
        notes="Tab-separated user, item, rating, timestamp; no header; train rows then test rows "
        "(NCF's leave-one-out item) are joined and re-split by the protocol.",
        known={"raw_ratings": 1_500_809, "raw_users": 55_187},
    )
)
_add(
    DatasetSpec(
        name="msd",
        title="Million Song Dataset, Taste Profile subset",
        parser="msd",
        raw_files=("train_triplets.txt",),
        files=(
            RemoteFile(
                "http://millionsongdataset.com/sites/default/files/challenge/"
                "train_triplets.txt.zip",
                "train_triplets.txt.zip",
            ),
        ),
        defaults=dict(
            min_rating=None,
            min_item_users=200,
            min_user_items=20,
            protocol="liang",
            heldout_users=50_000,
        ),
        homepage="http://millionsongdataset.com/tasteprofile/",
        licence="Taste Profile subset: free for non-commercial research; "
        "cite Bertin-Mahieux et al. "
        "(ISMIR 2011).",
        size="500 MB zip; 48,373,586 (user, song, play count) triplets by 1,019,318 users",
        notes="Tab-separated user, song, play count; no header. Every triplet is a positive.",
        known={
            "raw_ratings": 48_373_586,
            "raw_users": 1_019_318,
            "paper_users": 571_355,
            "paper_items": 41_140,
            "paper_heldout_users": 50_000,
        },
    )
)


def names() -> list[str]:
    return list(SPECS)


def get(name: str) -> DatasetSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise DataError(
            f"unknown dataset {name!r}; choose one of {', '.join(SPECS)} "
            "(or `vaecf prepare csv` for any other file)"
        ) from None


def home(root: str | os.PathLike | None = None) -> Path:
    """The data root: `root`, else $VAECF_HOME, else ~/.cache/vaecf."""
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("VAECF_HOME") or Path.home() / ".cache" / "vaecf")


def raw_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    return home(root) / "raw" / name


def prepared_root(root: str | os.PathLike | None = None) -> Path:
    return home(root) / "prepared"
