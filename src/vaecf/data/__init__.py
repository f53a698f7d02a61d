"""Data: raw interaction files -> prepared datasets (CSR splits, vocabularies, manifest)."""

from vaecf.data.matrix import CSR, SparseBatch
from vaecf.data.prepare import PreparedDataset, load_prepared, prepare_csv, prepare_frame
from vaecf.data.vocab import Vocabulary

__all__ = [
    "CSR",
    "PreparedDataset",
    "SparseBatch",
    "Vocabulary",
    "load_prepared",
    "prepare_csv",
    "prepare_frame",
]
